package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"rolter.dev/pkg/backoff"
	"rolter.dev/pkg/config"
	"rolter.dev/pkg/snapcache"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// ControlPlaneSource is a [Source] that follows the control plane's
// snapshot stream as a kvwatcher node: it receives the config without
// secrets, takes the providers with KV events or LMCache from it, and acks
// (or nacks, with the reason) every version. It tries each address in turn
// and reconnects with backoff; while no control plane answers, the watcher
// keeps the providers it has.
type ControlPlaneSource struct {
	// Addrs are the control planes' gRPC addresses.
	Addrs []string
	// Token is the node token of the snapshot service.
	Token string
	// TLSConfig, when set, dials with TLS (nil RootCAs: the system
	// roots); nil dials in plaintext.
	TLSConfig *tls.Config
	// NodeID names this watcher to the control plane (default hostname-pid).
	NodeID string
	// CacheFile keeps the last applied snapshot (package snapcache, the
	// proxy's --snapshot-cache format); at start, its providers are
	// watched until a control plane answers. Empty disables it.
	CacheFile string
	// Logger receives logs (required).
	Logger *slog.Logger
}

var _ Source = (*ControlPlaneSource)(nil)

// Run implements Source.
func (s *ControlPlaneSource) Run(ctx context.Context, update func([]Provider)) error {
	if len(s.Addrs) == 0 {
		return errors.New("kvwatcher: no control plane address")
	}
	if s.NodeID == "" {
		host, _ := os.Hostname()
		s.NodeID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	s.loadCache(update)
	// As the proxy (cpfollow): the wait after a round of failed addresses
	// grows with the time without a stream, so a restarted control plane
	// is followed within a fraction of a second of its return.
	lostAt := time.Now()
	for {
		for _, addr := range s.Addrs {
			got, err := s.session(ctx, addr, update)
			if ctx.Err() != nil {
				return nil
			}
			if got {
				lostAt = time.Now()
				s.Logger.Warn("control plane stream ended; reconnecting", "addr", addr, "err", err)
			} else {
				// Nothing received: unreachable, refused (token) or, with
				// TLS, a certificate that does not verify; err says which.
				s.Logger.Warn("cannot follow the control plane; retrying", "addr", addr, "tls", s.TLSConfig != nil, "err", err)
			}
		}
		t := time.NewTimer(backoff.Reconnect(time.Since(lostAt), 100*time.Millisecond, 5*time.Second, rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// loadCache gives update the cached snapshot's providers, if the cache
// holds a usable one; an unusable cache is logged and ignored.
func (s *ControlPlaneSource) loadCache(update func([]Provider)) {
	if s.CacheFile == "" {
		return
	}
	c, err := snapcache.Load(s.CacheFile)
	if err == nil && c == nil {
		return
	}
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse([]byte(c.ConfigTOML))
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		s.Logger.Warn("snapshot cache unusable; watching nothing until a control plane answers", "path", s.CacheFile, "err", err)
		return
	}
	providers, warnings := FromConfig(cfg)
	for _, w := range warnings {
		s.Logger.Warn(w)
	}
	update(providers)
	s.Logger.Info("watching the cached snapshot's providers until a control plane answers",
		"snapshot_version", c.VersionInfo, "saved_at", c.SavedAt, "providers", len(providers))
}

// saveCache writes resp to the cache file (when there is one).
func (s *ControlPlaneSource) saveCache(resp *pb.WatchResponse) {
	if s.CacheFile == "" {
		return
	}
	err := snapcache.Save(s.CacheFile, snapcache.Entry{
		VersionInfo: resp.GetVersionInfo(), Revision: resp.GetRevision(), ClusterID: resp.GetClusterId(),
		ContentHash: resp.GetContentHash(), PepperCheck: resp.GetPepperCheck(), ControlPlaneID: resp.GetControlplaneId(),
		ConfigTOML: resp.GetConfigToml(),
	})
	if err != nil {
		s.Logger.Warn("cannot write the snapshot cache", "path", s.CacheFile, "err", err)
	}
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// session follows one stream; got reports whether a snapshot arrived.
func (s *ControlPlaneSource) session(ctx context.Context, addr string, update func([]Provider)) (got bool, err error) {
	creds := insecure.NewCredentials()
	if s.TLSConfig != nil {
		creds = credentials.NewTLS(s.TLSConfig)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20))}
	if s.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: s.Token, secure: s.TLSConfig != nil}))
	}
	conn, err := grpc.NewClient(addr, opts...)
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
	if err := stream.Send(&pb.WatchRequest{Node: &pb.NodeInfo{Id: s.NodeID, Role: pb.NodeRole_NODE_ROLE_KVWATCHER}}); err != nil {
		return false, err
	}
	msgs := make(chan *pb.WatchResponse)
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, runs first) ends Recv
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
	running := ""
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case err := <-recvErr:
			return got, err
		case resp := <-msgs:
			got = true
			ack := &pb.WatchRequest{VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			cfg, err := config.Parse([]byte(resp.GetConfigToml()))
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil {
				ack.VersionInfo = running
				ack.ErrorDetail = &pb.ErrorDetail{Message: strings.TrimSpace(err.Error())}
				s.Logger.Error("snapshot refused; keeping the current providers", "snapshot_version", resp.GetVersionInfo(), "err", err)
			} else {
				providers, warnings := FromConfig(cfg)
				for _, w := range warnings {
					s.Logger.Warn(w)
				}
				update(providers)
				if running != resp.GetVersionInfo() {
					s.saveCache(resp)
				}
				running = resp.GetVersionInfo()
			}
			if err := stream.Send(ack); err != nil {
				return got, err
			}
		}
	}
}
