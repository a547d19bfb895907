package cpfollow

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"rolter.dev/dataplane/internal/metrics"
	"rolter.dev/pkg/backoff"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/snapcache"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// Applier takes a new snapshot; it returns an error when it cannot use it.
type Applier interface {
	Apply(*config.Snapshot) error
}

// Options configures a [Follower].
type Options struct {
	// Addrs are the control planes' gRPC addresses (host:port), tried in
	// turn. Required.
	Addrs []string
	// Token is the bearer token of the snapshot service.
	Token string
	// TLS, when set, dials with TLS; nil dials in plaintext.
	TLS *tls.Config
	// NodeID identifies this node (default hostname-pid).
	NodeID string
	// BuildVersion is reported to the control plane.
	BuildVersion string
	// CacheFile keeps the last applied snapshot; empty disables the cache.
	CacheFile string
	// KeyPepper must equal the control plane's for virtual keys to work.
	KeyPepper []byte
	// Applier receives compiled snapshots. Required.
	Applier Applier
	// Metrics are the proxy's config metrics (reload failures). Required.
	Metrics *metrics.Metrics
	// Registerer receives the follower's own metrics. Required.
	Registerer prometheus.Registerer
	// Logger receives logs. Required.
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait after a round of failed
	// addresses (defaults 100 ms and 5 s).
	MinBackoff, MaxBackoff time.Duration
	// FirstSnapshotTimeout is how long a new stream may take to deliver its
	// first snapshot before the next address is tried (default 10 s).
	FirstSnapshotTimeout time.Duration
	// LookupEnv and ReadFile resolve provider API key references (default:
	// the process environment and file system).
	LookupEnv func(string) (string, bool)
	ReadFile  func(string) ([]byte, error)
	// TracerProvider receives a span per snapshot handled (default: the
	// global provider, a no-op unless the process set one).
	TracerProvider trace.TracerProvider
}

// Follower follows control planes. Create it with [New].
type Follower struct {
	opts    Options
	log     *slog.Logger
	tracer  trace.Tracer
	m       *followMetrics
	pepper  string // PepperCheck of opts.KeyPepper
	mu      sync.Mutex
	current running // guarded by mu; written only by the goroutine running Run (and LoadCache before it)
}

// running describes the snapshot in use.
type running struct {
	version   string
	revision  int64
	clusterID uint64
	hash      string
}

type followMetrics struct {
	revision   prometheus.Gauge
	applies    *prometheus.CounterVec
	connected  prometheus.Gauge
	reconnects prometheus.Counter
}

// New returns a follower; call LoadCache, then Run.
func New(opts Options) *Follower {
	if opts.NodeID == "" {
		host, _ := os.Hostname()
		opts.NodeID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.FirstSnapshotTimeout == 0 {
		opts.FirstSnapshotTimeout = 10 * time.Second
	}
	m := &followMetrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_config_snapshot_revision", Help: "Control-plane config revision (etcd revision) of the snapshot in use; 0 before the first.",
		}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rolter_config_apply_total", Help: "Control-plane snapshots handled, by source (controlplane, cache) and result (applied, unchanged, stale, refused).",
		}, []string{"source", "result"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rolter_controlplane_connected", Help: "1 while a snapshot stream to a control plane is open.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rolter_controlplane_stream_failures_total", Help: "Snapshot streams that failed or ended (each is followed by a reconnect).",
		}),
	}
	opts.Registerer.MustRegister(m.revision, m.applies, m.connected, m.reconnects)
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	return &Follower{
		opts: opts, m: m, pepper: config.PepperCheck(opts.KeyPepper), tracer: opts.TracerProvider.Tracer(TracerName),
		log: opts.Logger.With("component", "cpfollow", "node_id", opts.NodeID),
	}
}

// Version is the control-plane version in use, or "" before the first.
func (f *Follower) Version() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current.version
}

func (f *Follower) running() running {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current
}

// LoadCache applies the cached snapshot, if there is one. A missing cache
// is not an error; an unusable one is reported and ignored.
func (f *Follower) LoadCache() error {
	if f.opts.CacheFile == "" {
		return nil
	}
	c, err := snapcache.Load(f.opts.CacheFile)
	if err != nil {
		return fmt.Errorf("cpfollow: %w", err)
	}
	if c == nil {
		return nil
	}
	resp := &pb.WatchResponse{
		VersionInfo: c.VersionInfo, Revision: c.Revision, ClusterId: c.ClusterID, ContentHash: c.ContentHash,
		PepperCheck: c.PepperCheck, ConfigToml: c.ConfigTOML, ControlplaneId: c.ControlPlaneID,
	}
	if _, err := f.handle(resp, "cache"); err != nil {
		return fmt.Errorf("cpfollow: snapshot cache %s: %w", f.opts.CacheFile, err)
	}
	f.log.Info("serving the cached snapshot until a control plane answers", "snapshot_version", c.VersionInfo, "saved_at", c.SavedAt)
	return nil
}

// handle compiles and applies one snapshot, in a span. It returns the
// version now in use, or the reason the snapshot was refused.
func (f *Follower) handle(resp *pb.WatchResponse, source string) (string, error) {
	_, span := f.tracer.Start(context.Background(), "cpfollow.snapshot", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		AttrVersion.String(resp.GetVersionInfo()), AttrRevision.Int64(resp.GetRevision()),
		AttrControlPlaneID.String(resp.GetControlplaneId()), AttrNodeID.String(f.opts.NodeID), AttrSource.String(source)))
	defer span.End()
	version, result, err := f.apply(resp, source)
	f.m.applies.WithLabelValues(source, result).Inc()
	span.SetAttributes(AttrResult.String(result), AttrRunning.String(version))
	if err != nil {
		span.SetAttributes(AttrError.String(err.Error()))
		span.SetStatus(otelcodes.Error, "snapshot refused")
	}
	return version, err
}

// apply compiles and applies one snapshot; result is applied, unchanged,
// stale or refused.
func (f *Follower) apply(resp *pb.WatchResponse, source string) (version, result string, err error) {
	cur := f.running()
	sameCluster := cur.clusterID == resp.GetClusterId()
	switch {
	case cur.hash != "" && cur.hash == resp.GetContentHash() && sameCluster:
		if resp.GetRevision() > cur.revision {
			f.setRunning(resp)
			f.save(resp)
		}
		return resp.GetVersionInfo(), "unchanged", nil
	case cur.version != "" && sameCluster && resp.GetRevision() < cur.revision:
		f.log.Debug("ignoring an older snapshot", "snapshot_version", resp.GetVersionInfo(), "running", cur.version)
		return cur.version, "stale", nil
	}
	snap, err := f.compile(resp)
	if err == nil {
		err = f.opts.Applier.Apply(snap)
	}
	if err != nil {
		f.opts.Metrics.ConfigFailures.Inc()
		return cur.version, "refused", err
	}
	f.setRunning(resp)
	if source != "cache" {
		f.save(resp)
	}
	return resp.GetVersionInfo(), "applied", nil
}

func (f *Follower) setRunning(resp *pb.WatchResponse) {
	f.mu.Lock()
	f.current = running{version: resp.GetVersionInfo(), revision: resp.GetRevision(), clusterID: resp.GetClusterId(), hash: resp.GetContentHash()}
	f.mu.Unlock()
	f.m.revision.Set(float64(resp.GetRevision()))
}

// compile builds a snapshot with the same code as file mode.
func (f *Follower) compile(resp *pb.WatchResponse) (*config.Snapshot, error) {
	cfg, err := config.Parse([]byte(resp.GetConfigToml()))
	if err != nil {
		return nil, err
	}
	if err := errors.Join(cfg.Validate(), cfg.CheckRoutes()); err != nil {
		return nil, err
	}
	if len(cfg.VirtualKeys) > 0 && resp.GetPepperCheck() != "" && resp.GetPepperCheck() != f.pepper {
		return nil, fmt.Errorf("cpfollow: this data plane's key pepper differs from the control plane's "+
			"(fingerprints %s and %s): virtual keys would not authenticate; set the same ROLTER_KEY_PEPPER", f.pepper, resp.GetPepperCheck())
	}
	cfg.Server.KeyPepper = string(f.opts.KeyPepper)
	lookup := f.opts.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	return config.Compile(cfg, config.CompileOptions{
		Version: resp.GetVersionInfo(),
		// The pepper is the one given in Options, never a second source.
		LookupEnv: func(name string) (string, bool) {
			if name == "ROLTER_KEY_PEPPER" {
				return "", false
			}
			return lookup(name)
		},
		ReadFile: f.opts.ReadFile,
	})
}

// save writes the cache (atomically, see package snapcache).
func (f *Follower) save(resp *pb.WatchResponse) {
	if f.opts.CacheFile == "" {
		return
	}
	err := snapcache.Save(f.opts.CacheFile, snapcache.Entry{
		VersionInfo: resp.GetVersionInfo(), Revision: resp.GetRevision(), ClusterID: resp.GetClusterId(),
		ContentHash: resp.GetContentHash(), PepperCheck: resp.GetPepperCheck(), ControlPlaneID: resp.GetControlplaneId(),
		ConfigTOML: resp.GetConfigToml(),
	})
	if err != nil {
		f.log.Warn("cannot write the snapshot cache", "path", f.opts.CacheFile, "err", err)
	}
}

// Run follows the control planes until ctx ends.
//
// After a stream is lost (or at start) the next address is tried at once;
// after a round of failed addresses the wait is [backoff.Reconnect] of the
// time without a stream, so a restarted control plane is followed within
// a fraction of a second of its return, and a long outage is retried at
// most every MaxBackoff.
func (f *Follower) Run(ctx context.Context) {
	failedRound := 0
	lostAt := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		addr := f.opts.Addrs[i%len(f.opts.Addrs)]
		got, err := f.session(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		f.m.reconnects.Inc()
		if got {
			failedRound = 0
			lostAt = time.Now()
			f.log.Warn("control-plane stream ended; reconnecting, still serving the last snapshot", "addr", addr, "err", err)
		} else {
			f.log.Debug("control plane unreachable", "addr", addr, "err", err)
		}
		if got || (i+1)%len(f.opts.Addrs) != 0 {
			continue // try the next address at once
		}
		failedRound++
		if failedRound == 1 {
			if v := f.Version(); v != "" {
				f.log.Warn("no control plane reachable; still serving the last snapshot", "addrs", f.opts.Addrs, "err", err, "snapshot_version", v)
			} else {
				f.log.Warn("no control plane reachable and no snapshot yet: answering 503 until one arrives", "addrs", f.opts.Addrs, "err", err)
			}
		}
		d := backoff.Reconnect(time.Since(lostAt), f.opts.MinBackoff, f.opts.MaxBackoff, rand.Float64())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

type tokenCreds struct {
	token  string
	secure bool
}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

func (c tokenCreds) RequireTransportSecurity() bool { return c.secure }

// session runs one stream to addr. got reports whether it delivered at
// least one snapshot.
func (f *Follower) session(ctx context.Context, addr string) (got bool, err error) {
	creds := insecure.NewCredentials()
	if f.opts.TLS != nil {
		creds = credentials.NewTLS(f.opts.TLS)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 15 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}
	if f.opts.Token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(tokenCreds{token: f.opts.Token, secure: f.opts.TLS != nil}))
	}
	conn, err := grpc.NewClient(addr, dialOpts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewSnapshotServiceClient(conn).Watch(sctx)
	if err != nil {
		return false, err
	}
	hello := &pb.WatchRequest{
		Node:        &pb.NodeInfo{Id: f.opts.NodeID, Role: pb.NodeRole_NODE_ROLE_DATAPLANE, BuildVersion: f.opts.BuildVersion},
		VersionInfo: f.Version(),
	}
	if err := stream.Send(hello); err != nil {
		return false, err
	}

	msgs := make(chan *pb.WatchResponse)
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	// Deferred in this order so that cancel runs first: it ends Recv,
	// and the receiver goroutine, which wg.Wait then waits for.
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- resp:
			case <-sctx.Done():
				return
			}
		}
	})

	first := time.NewTimer(f.opts.FirstSnapshotTimeout)
	defer first.Stop()
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-first.C:
			if !got {
				return false, fmt.Errorf("no snapshot from %s within %s", addr, f.opts.FirstSnapshotTimeout)
			}
		case err := <-recvErr:
			return got, err
		case resp := <-msgs:
			if !got {
				got = true
				f.m.connected.Set(1)
				defer f.m.connected.Set(0)
				f.log.Info("following control plane", "addr", addr, "controlplane_id", resp.GetControlplaneId())
			}
			version, err := f.handle(resp, "controlplane")
			ack := &pb.WatchRequest{VersionInfo: version, ResponseNonce: resp.GetNonce()}
			if err != nil {
				ack.ErrorDetail = errorDetail(err)
				f.log.Error("snapshot refused; the previous config keeps serving", "snapshot_version", resp.GetVersionInfo(), "err", err)
			} else if version == resp.GetVersionInfo() {
				f.log.Info("snapshot applied", "snapshot_version", version)
			}
			if err := stream.Send(ack); err != nil {
				return got, err
			}
		}
	}
}

// errorDetail turns a refusal into a NACK detail, with field paths.
func errorDetail(err error) *pb.ErrorDetail {
	d := &pb.ErrorDetail{Message: err.Error()}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // walking a join
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			d.Violations = append(d.Violations, &pb.FieldViolation{Field: fe.Path, Description: fe.Msg})
		}
	}
	return d
}
