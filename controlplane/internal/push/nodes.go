package push

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	"rolter.dev/controlplane/internal/metrics"
	"rolter.dev/controlplane/internal/store"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// NodeRecord is one node's status as stored in etcd (JSON) and reported by
// Status.
type NodeRecord struct {
	NodeID         string    `json:"node_id"`
	Role           string    `json:"role"`
	ControlPlaneID string    `json:"controlplane_id"`
	Peer           string    `json:"peer"`
	AckedVersion   string    `json:"acked_version"`
	SentVersion    string    `json:"sent_version"`
	State          string    `json:"state"`
	ErrorDetail    string    `json:"error_detail,omitempty"`
	BuildVersion   string    `json:"build_version,omitempty"`
	ConnectedAt    time.Time `json:"connected_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func (r *NodeRecord) proto() *pb.NodeStatus {
	return &pb.NodeStatus{
		NodeId: r.NodeID, Role: pb.NodeRole(pb.NodeRole_value[r.Role]), ControlplaneId: r.ControlPlaneID,
		Peer: r.Peer, AckedVersion: r.AckedVersion, SentVersion: r.SentVersion,
		State: pb.NodeState(pb.NodeState_value[r.State]), ErrorDetail: r.ErrorDetail,
		ConnectedAt: timestamppb.New(r.ConnectedAt), UpdatedAt: timestamppb.New(r.UpdatedAt),
		BuildVersion: r.BuildVersion,
	}
}

// cpRecord is one replica's status as stored in etcd.
type cpRecord struct {
	ID        string    `json:"controlplane_id"`
	Revision  int64     `json:"revision"`
	Nodes     int       `json:"connected_nodes"`
	UpdatedAt time.Time `json:"updated_at"`
}

type nodeEntry struct {
	rec    NodeRecord
	stream uint64
	// latencyFrom is when the pending snapshot's push started, for the
	// push-latency histogram; zero once answered.
	latencyFrom time.Time
}

// Registry tracks the nodes connected to this replica and mirrors them to
// etcd under leased keys, so that Status on any replica lists every node,
// and a dead replica's nodes vanish with its lease. Safe for concurrent use.
//
// Lock order: Registry.mu is a leaf; it is never held across I/O.
type Registry struct {
	cpID    string
	cli     *clientv3.Client
	layout  store.Layout
	hub     *Hub
	metrics *metrics.Metrics
	log     *slog.Logger

	mu    sync.Mutex
	nodes map[string]*nodeEntry
	seq   uint64
	dirty map[string]bool
	wake  chan struct{} // cap 1: a pending flush request

	// Owned by the goroutine running Run.
	leased    clientv3.LeaseID
	lastCP    cpRecord // last replica record written, UpdatedAt zeroed
	lastLease clientv3.LeaseID
}

// NewRegistry returns an empty registry of replica cpID.
func NewRegistry(cpID string, cli *clientv3.Client, layout store.Layout, hub *Hub, m *metrics.Metrics, log *slog.Logger) *Registry {
	return &Registry{
		cpID: cpID, cli: cli, layout: layout, hub: hub, metrics: m, log: log.With("component", "nodes"),
		nodes: map[string]*nodeEntry{}, dirty: map[string]bool{}, wake: make(chan struct{}, 1),
	}
}

func (r *Registry) touch(id string) {
	r.dirty[id] = true
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// connect registers a stream of node and returns its stream token. A newer
// stream of the same node id replaces an older one.
func (r *Registry) connect(info *pb.NodeInfo, peer, version string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	now := time.Now()
	if old := r.nodes[info.GetId()]; old != nil {
		r.metrics.ConnectedNodes.WithLabelValues(roleLabel(old.rec.Role)).Dec()
	}
	r.nodes[info.GetId()] = &nodeEntry{stream: r.seq, rec: NodeRecord{
		NodeID: info.GetId(), Role: info.GetRole().String(), ControlPlaneID: r.cpID, Peer: peer,
		AckedVersion: version, State: pb.NodeState_NODE_STATE_PENDING.String(),
		BuildVersion: info.GetBuildVersion(), ConnectedAt: now, UpdatedAt: now,
	}}
	r.metrics.ConnectedNodes.WithLabelValues(roleLabel(info.GetRole().String())).Inc()
	r.touch(info.GetId())
	return r.seq
}

func roleLabel(role string) string {
	return strings.ToLower(strings.TrimPrefix(role, "NODE_ROLE_"))
}

func (r *Registry) entry(id string, stream uint64) *nodeEntry {
	e := r.nodes[id]
	if e == nil || e.stream != stream {
		return nil
	}
	return e
}

// sent records that version went out to the node.
func (r *Registry) sent(id string, stream uint64, version string, latencyFrom time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.entry(id, stream); e != nil {
		e.rec.SentVersion, e.rec.State, e.rec.UpdatedAt = version, pb.NodeState_NODE_STATE_PENDING.String(), time.Now()
		e.latencyFrom = latencyFrom
		r.touch(id)
	}
}

// answered records an ACK (detail empty) or a NACK of the sent version;
// version is what the node runs now.
func (r *Registry) answered(id string, stream uint64, version, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entry(id, stream)
	if e == nil {
		return
	}
	e.rec.AckedVersion, e.rec.UpdatedAt, e.rec.ErrorDetail = version, time.Now(), detail
	if detail == "" {
		e.rec.State = pb.NodeState_NODE_STATE_ACKED.String()
		r.metrics.NodeAcks.WithLabelValues("ack").Inc()
		if !e.latencyFrom.IsZero() {
			r.metrics.PushLatency.Observe(time.Since(e.latencyFrom).Seconds())
		}
	} else {
		e.rec.State = pb.NodeState_NODE_STATE_NACKED.String()
		r.metrics.NodeAcks.WithLabelValues("nack").Inc()
	}
	e.latencyFrom = time.Time{}
	if rev, err := parseRevision(version); err == nil {
		r.metrics.NodeRevision.WithLabelValues(id).Set(float64(rev))
	}
	r.touch(id)
}

// disconnect forgets the node's stream (unless a newer one replaced it).
func (r *Registry) disconnect(id string, stream uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entry(id, stream)
	if e == nil {
		return
	}
	delete(r.nodes, id)
	r.metrics.ConnectedNodes.WithLabelValues(roleLabel(e.rec.Role)).Dec()
	r.metrics.NodeRevision.DeleteLabelValues(id)
	r.touch(id)
}

// Local returns this replica's nodes, sorted by id.
func (r *Registry) Local() []NodeRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]NodeRecord, 0, len(r.nodes))
	for _, e := range r.nodes {
		out = append(out, e.rec)
	}
	slices.SortFunc(out, func(a, b NodeRecord) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

const leaseTTL = 10 // seconds

// Run mirrors the registry to etcd until ctx ends, then removes this
// replica's records (best effort; the lease expires anyway).
func (r *Registry) Run(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.release()
			return
		case <-r.wake:
		case <-t.C:
			r.keepAlive(ctx)
		}
		r.flush(ctx)
	}
}

func (r *Registry) markAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.nodes {
		r.dirty[id] = true
	}
}

func (r *Registry) keepAlive(ctx context.Context) {
	if r.leased == 0 {
		return
	}
	kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := r.cli.KeepAliveOnce(kctx, r.leased); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			r.leased = 0
		}
		r.log.Debug("status lease keep-alive failed", "err", err)
	}
}

func (r *Registry) flush(ctx context.Context) {
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if r.leased == 0 {
		lr, err := r.cli.Grant(fctx, leaseTTL)
		if err != nil {
			r.log.Debug("cannot grant the status lease", "err", err)
			return
		}
		r.leased = lr.ID
		r.markAll()
	}
	r.mu.Lock()
	dirty := r.dirty
	r.dirty = map[string]bool{}
	recs := make(map[string]*NodeRecord, len(dirty))
	for id := range dirty {
		if e := r.nodes[id]; e != nil {
			rec := e.rec
			recs[id] = &rec
		} else {
			recs[id] = nil
		}
	}
	count := len(r.nodes)
	r.mu.Unlock()

	failed := map[string]bool{}
	for id, rec := range recs {
		var err error
		key := r.layout.Node(id)
		if rec == nil {
			// Delete only our own record: the node may have moved to
			// another replica already.
			_, err = r.cli.Txn(fctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", r.leased)).
				Then(clientv3.OpDelete(key)).Commit()
		} else {
			b, _ := json.Marshal(rec)
			_, err = r.cli.Put(fctx, key, string(b), clientv3.WithLease(r.leased))
		}
		if err != nil {
			failed[id] = true
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				r.leased = 0
			}
		}
	}
	var rev int64
	if s, _ := r.hub.Current(); s != nil {
		rev = s.Revision
	}
	// Written only when it changes: every put is an etcd revision.
	if cp := (cpRecord{ID: r.cpID, Revision: rev, Nodes: count}); cp != r.lastCP || r.leased != r.lastLease {
		cp.UpdatedAt = time.Now()
		b, _ := json.Marshal(cp)
		if _, err := r.cli.Put(fctx, r.layout.ControlPlane(r.cpID), string(b), clientv3.WithLease(r.leased)); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				r.leased = 0
			}
			r.log.Debug("cannot write replica status", "err", err)
		} else {
			cp.UpdatedAt = time.Time{}
			r.lastCP, r.lastLease = cp, r.leased
		}
	}
	if len(failed) > 0 {
		r.mu.Lock()
		for id := range failed {
			r.dirty[id] = true
		}
		r.mu.Unlock()
	}
}

func (r *Registry) release() {
	if r.leased == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = r.cli.Revoke(ctx, r.leased)
}

// Status answers the admin Status call: the stored config revision, every
// replica and every node, read from etcd; if etcd cannot be read, this
// replica's own view with a warning.
func (r *Registry) Status(ctx context.Context) *pb.StatusResponse {
	out := &pb.StatusResponse{ControlplaneId: r.cpID}
	local := r.Local()
	byID := map[string]*pb.NodeStatus{}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := r.cli.Txn(sctx).Then(
		clientv3.OpGet(r.layout.Marker()),
		clientv3.OpGet(r.layout.ControlPlanesPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(r.layout.NodesPrefix(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		out.Warning = "etcd unavailable (" + err.Error() + "): showing only this control plane's nodes"
		if s, _ := r.hub.Current(); s != nil {
			out.Revision = s.Revision
		}
		out.Controlplanes = append(out.Controlplanes, &pb.ControlPlaneStatus{
			ControlplaneId: r.cpID, Revision: out.Revision, ConnectedNodes: int32(len(local)), UpdatedAt: timestamppb.Now(),
		})
	} else {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			out.Revision = kvs[0].ModRevision
		}
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			var c cpRecord
			if json.Unmarshal(kv.Value, &c) == nil {
				out.Controlplanes = append(out.Controlplanes, &pb.ControlPlaneStatus{
					ControlplaneId: c.ID, Revision: c.Revision, ConnectedNodes: int32(c.Nodes), UpdatedAt: timestamppb.New(c.UpdatedAt),
				})
			}
		}
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			var n NodeRecord
			if json.Unmarshal(kv.Value, &n) == nil {
				byID[n.NodeID] = n.proto()
			}
		}
	}
	for i := range local { // our own view is the freshest for our nodes
		byID[local[i].NodeID] = local[i].proto()
	}
	for _, n := range byID {
		out.Nodes = append(out.Nodes, n)
	}
	slices.SortFunc(out.Nodes, func(a, b *pb.NodeStatus) int { return strings.Compare(a.NodeId, b.NodeId) })
	slices.SortFunc(out.Controlplanes, func(a, b *pb.ControlPlaneStatus) int { return strings.Compare(a.ControlplaneId, b.ControlplaneId) })
	return out
}
