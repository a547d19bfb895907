package push

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// Server implements the SnapshotService: one goroutine per stream sends
// the hub's snapshot whenever its revision differs from what the node was
// last sent, and records the node's ACKs and NACKs by nonce.
type Server struct {
	pb.UnimplementedSnapshotServiceServer
	cpID        string
	hub         *Hub
	reg         *Registry
	pepperCheck string
	tracer      trace.Tracer
	log         *slog.Logger
	closing     chan struct{} // closed by Shutdown
	closeOnce   sync.Once
}

var _ pb.SnapshotServiceServer = (*Server)(nil)

// NewServer returns the snapshot service of replica cpID. tp traces every
// push (nil: not traced).
func NewServer(cpID string, hub *Hub, reg *Registry, pepperCheck string, tp trace.TracerProvider, log *slog.Logger) *Server {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &Server{
		cpID: cpID, hub: hub, reg: reg, pepperCheck: pepperCheck, tracer: tp.Tracer(TracerName),
		log: log.With("component", "push"), closing: make(chan struct{}),
	}
}

// Shutdown ends every open stream with UNAVAILABLE, so that nodes move to
// another replica at once and a graceful server stop need not wait for
// them. Safe to call more than once.
func (s *Server) Shutdown() { s.closeOnce.Do(func() { close(s.closing) }) }

func parseRevision(version string) (int64, error) { return strconv.ParseInt(version, 10, 64) }

func newNonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Watch implements pb.SnapshotServiceServer.
func (s *Server) Watch(stream pb.SnapshotService_WatchServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	node := first.GetNode()
	if node.GetId() == "" {
		return status.Error(codes.InvalidArgument, "the first message must carry node.id")
	}
	switch node.GetRole() {
	case pb.NodeRole_NODE_ROLE_UNSPECIFIED:
		node.Role = pb.NodeRole_NODE_ROLE_DATAPLANE
	case pb.NodeRole_NODE_ROLE_DATAPLANE, pb.NodeRole_NODE_ROLE_KVWATCHER:
	default:
		return status.Errorf(codes.InvalidArgument, "unknown node role %d", node.GetRole())
	}
	addr := ""
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr.String()
	}
	connected := time.Now()
	token := s.reg.connect(node, addr, first.GetVersionInfo())
	defer s.reg.disconnect(node.GetId(), token)
	log := s.log.With("node_id", node.GetId(), "role", strings.ToLower(strings.TrimPrefix(node.GetRole().String(), "NODE_ROLE_")), "peer", addr)
	log.Info("node connected", "node_version", first.GetVersionInfo())
	defer log.Info("node disconnected")

	// The receiver ends when the stream does: Recv fails once this handler
	// has returned, and its sends select on ctx.
	reqs := make(chan *pb.WatchRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	var (
		sentRev     int64 = -1
		sentCluster uint64
		nonce       string
		pending     trace.Span // the push awaiting its answer
	)
	defer func() { endPush(pending, "unanswered", "", "") }()
	role := strings.ToLower(strings.TrimPrefix(node.GetRole().String(), "NODE_ROLE_"))
	for {
		snap, changed := s.hub.Current()
		if snap != nil && (snap.Revision != sentRev || snap.ClusterID != sentCluster) {
			p := snap.payloads[node.GetRole()]
			nonce = newNonce()
			resp := &pb.WatchResponse{
				VersionInfo: snap.Version, Revision: snap.Revision, Nonce: nonce, ConfigToml: string(p.toml),
				ControlplaneId: s.cpID, ClusterId: snap.ClusterID, PepperCheck: s.pepperCheck, ContentHash: p.hash,
			}
			from := snap.Published
			if from.Before(connected) {
				from = time.Now()
			}
			endPush(pending, "superseded", "", "")
			_, pending = s.tracer.Start(ctx, "push.snapshot", trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
				AttrVersion.String(snap.Version), AttrRevision.Int64(snap.Revision), AttrNodeID.String(node.GetId()),
				AttrNodeRole.String(role), AttrControlPlaneID.String(s.cpID)))
			if err := stream.Send(resp); err != nil {
				pending.RecordError(err)
				return err
			}
			sentRev, sentCluster = snap.Revision, snap.ClusterID
			s.reg.sent(node.GetId(), token, snap.Version, from)
			log.Debug("snapshot sent", "snapshot_version", snap.Version)
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.closing:
			return status.Error(codes.Unavailable, "control plane shutting down")
		case <-changed:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-reqs:
			if req.GetResponseNonce() != nonce {
				continue // an answer to an older push (xDS ignores those too)
			}
			if d := req.GetErrorDetail(); d != nil {
				detail := d.GetMessage()
				if detail == "" {
					detail = "refused without a reason"
				}
				s.reg.answered(node.GetId(), token, req.GetVersionInfo(), detail)
				endPush(pending, "nack", req.GetVersionInfo(), detail)
				pending = nil
				log.Warn("node refused a snapshot", "snapshot_version", sentVersion(sentRev), "node_version", req.GetVersionInfo(), "reason", detail)
			} else {
				s.reg.answered(node.GetId(), token, req.GetVersionInfo(), "")
				endPush(pending, "ack", req.GetVersionInfo(), "")
				pending = nil
				log.Debug("node acknowledged", "snapshot_version", req.GetVersionInfo())
			}
		}
	}
}

func sentVersion(rev int64) string { return strconv.FormatInt(rev, 10) }
