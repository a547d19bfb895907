package push

import (
	"strconv"
	"sync"
	"time"

	pb "rolter.dev/proto/rolter/controlplane/v1"

	"rolter.dev/controlplane/internal/state"
)

// Snapshot is one published config, rendered once per node role.
type Snapshot struct {
	Revision  int64
	ClusterID uint64
	// Version is the decimal revision, the version_info sent to nodes.
	Version string
	// Published is when this replica learned of the revision.
	Published time.Time
	payloads  map[pb.NodeRole]payload
}

type payload struct {
	toml []byte
	hash string
}

// newSnapshot renders st for every role.
func newSnapshot(st *state.State, now time.Time) (*Snapshot, error) {
	s := &Snapshot{
		Revision: st.Revision, ClusterID: st.ClusterID, Version: strconv.FormatInt(st.Revision, 10),
		Published: now, payloads: map[pb.NodeRole]payload{},
	}
	for role, o := range map[pb.NodeRole]state.RenderOptions{
		pb.NodeRole_NODE_ROLE_DATAPLANE: {},
		pb.NodeRole_NODE_ROLE_KVWATCHER: {NoKeys: true, NoInlineSecrets: true},
	} {
		b, h, err := st.Render(o)
		if err != nil {
			return nil, err
		}
		s.payloads[role] = payload{toml: b, hash: h}
	}
	return s, nil
}

// Hub holds the snapshot this replica publishes and wakes the streams when
// it changes (go-control-plane's SetSnapshot). Safe for concurrent use.
type Hub struct {
	mu      sync.Mutex
	cur     *Snapshot
	changed chan struct{} // closed and replaced on every Set; guarded by mu
}

// NewHub returns a hub with no snapshot.
func NewHub() *Hub { return &Hub{changed: make(chan struct{})} }

// Set publishes st if it is a different revision (or cluster) than the
// current snapshot, and reports whether it did.
func (h *Hub) Set(st *state.State) (bool, error) {
	h.mu.Lock()
	cur := h.cur
	h.mu.Unlock()
	if cur != nil && cur.Revision == st.Revision && cur.ClusterID == st.ClusterID {
		return false, nil
	}
	s, err := newSnapshot(st, time.Now())
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur = s
	close(h.changed)
	h.changed = make(chan struct{})
	return true, nil
}

// Current returns the snapshot (nil before the first) and a channel closed
// at the next change.
func (h *Hub) Current() (*Snapshot, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.changed
}
