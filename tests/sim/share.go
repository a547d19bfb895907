package sim

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/routing"
)

// Defaults of the sharing model (Config.Share*).
const (
	// DefaultShareDelay is the trip of a fleet message from one proxy to
	// another through NATS on a LAN: about a millisecond, rounded up.
	DefaultShareDelay = 2 * time.Millisecond
)

// simEpoch anchors the virtual clock for pkg/fleet, which takes wall times.
var simEpoch = time.Unix(1_700_000_000, 0)

// sharing is the state of proxies sharing their routing state (Config.Share)
// through pkg/fleet, the code path rolter-proxy --nats runs: each proxy is a
// fleet.Node whose route records what its balancer observes; every flush
// and load interval each node's encoded messages reach every other node
// Config.ShareDelay later.
type sharing struct {
	nodes   []*fleet.Node
	routes  []*fleet.Route
	total   int // turns in the workload: ticking stops once all completed
	scratch [][]int
	// urgent and ticked count the queue reports published at once
	// (fleet.Node.Urgent) and on the queue ticks.
	urgent, ticked uint64
}

// shareMsg is one encoded fleet message on its way to the other proxies.
type shareMsg struct {
	from  int
	loads bool
	data  []byte
}

// shareEnabled reports whether this run shares state: asked for, with
// several proxies and one of rolter's own strategies (the peers' policies
// have no sharing).
func (r *run) shareEnabled() bool {
	return r.cfg.Share && r.cfg.Proxies > 1 && slices.Contains(RolterStrategies, r.strategy.Base)
}

// newShareNode makes proxy p's fleet node and route; env.Share records into
// it.
func (r *run) newShareNode(p int, env *Env) {
	if r.share == nil {
		r.share = &sharing{}
		for _, s := range r.w.Sessions {
			r.share.total += len(s.Turns)
		}
	}
	n := fleet.NewNode(fleet.Options{ID: fmt.Sprintf("proxy-%d", p), FlushInterval: r.cfg.ShareFlush, LoadInterval: r.cfg.ShareLoadInterval,
		QueueInterval: r.cfg.ShareQueueInterval})
	rt := n.Bind("sim", 1, r.cfg.Replicas)
	r.share.nodes = append(r.share.nodes, n)
	r.share.routes = append(r.share.routes, rt)
	r.share.scratch = append(r.share.scratch, make([]int, r.cfg.Replicas))
	env.Share = rt.Record
}

// bindShare connects proxy p's policy to its route once built, and a
// predicted_ttft policy's later balancers (:scale_s, :drain_s,
// :restart_s) too.
func (r *run) bindShare(p int, px *proxy) {
	rt := r.share.routes[p]
	bind := func(b routing.Balancer) {
		if sa, ok := b.(routing.SharedAffinity); ok {
			rt.SetAffinity(sa)
		}
		if sq, ok := b.(routing.SharedQueue); ok {
			rt.SetQueue(sq)
		}
	}
	if b, ok := px.policy.(interface{ inner() *balancer }); ok {
		bind(b.inner().b)
	}
	if t, ok := px.policy.(*ttftPolicy); ok {
		t.rebind = bind
	}
	rt.SetOwnLoad(func(i int) int { return px.loads[i] })
}

// joinShare delivers every proxy's load report to the others before the
// first request, as in a fleet that was running before the traffic came:
// each proxy knows its place among the others (routing.SharedQueue's
// SetPlace) from the first pick, not from the first load interval on.
// Two rounds of reports, the first sent three trips before the start and
// the second one trip before it, each heard a trip after it was sent, so
// that each proxy has also measured its trip to the others (the second
// round's echoes of the first).
func (r *run) joinShare() {
	start := simEpoch.Add(r.now)
	d := r.cfg.ShareDelay
	for _, sent := range []time.Time{start.Add(-3 * d), start.Add(-d)} {
		reports := make([][]byte, len(r.share.nodes))
		for p, n := range r.share.nodes {
			reports[p] = n.LoadReportAt(sent.Add(r.skew[p]))
		}
		for p, data := range reports {
			for q, m := range r.share.nodes {
				if q != p {
					m.HandleLoads(data, sent.Add(d+r.skew[q]))
				}
			}
		}
	}
}

// startShare schedules the first flush and load ticks.
func (r *run) startShare() {
	r.pushShare(r.now+r.cfg.ShareFlush, evShareFlush, nil)
	r.pushShare(r.now+r.cfg.ShareLoadInterval, evShareLoad, nil)
	r.pushShare(r.now+r.cfg.ShareQueueInterval, evShareQueue, nil)
}

func (r *run) pushShare(at time.Duration, kind uint8, m *shareMsg) {
	r.seq++
	heap.Push(&r.events, event{at: at, seq: r.seq, kind: kind, share: m})
}

// shareEvent handles a sharing event: a tick publishes every node's
// messages (delivered after the delay), a delivery hands one message to
// every other node.
func (r *run) shareEvent(e event) {
	sh, now := r.share, simEpoch.Add(r.now)
	switch e.kind {
	case evShareFlush, evShareQueue, evShareLoad:
		for p, n := range sh.nodes {
			now := now.Add(r.skew[p]) // each node reads its own wall clock
			m := &shareMsg{from: p, loads: e.kind == evShareLoad}
			switch e.kind {
			case evShareLoad:
				m.data = n.LoadReportAt(now)
				n.Expire(now)
			case evShareQueue:
				m.data = n.FlushQueues()
				if m.data != nil {
					sh.ticked++
				}
			default:
				m.data = n.FlushObservations()
			}
			if m.data != nil {
				r.pushShare(r.now+r.cfg.ShareDelay, evShareDeliver, m)
			}
		}
		if r.completed < sh.total {
			every := r.cfg.ShareFlush
			switch e.kind {
			case evShareLoad:
				every = r.cfg.ShareLoadInterval
			case evShareQueue:
				every = r.cfg.ShareQueueInterval
			}
			r.pushShare(r.now+every, e.kind, nil)
		}
	case evShareDeliver:
		for p, n := range sh.nodes {
			if p == e.share.from {
				continue
			}
			now := now.Add(r.skew[p])
			if e.share.loads {
				n.HandleLoads(e.share.data, now)
			} else {
				n.HandleObservations(e.share.data, now)
			}
		}
	}
}

// urgentShare publishes proxy p's queue reports at once if its balancer
// asked, as its Defer and Observe may in a burst (fleet.Node.Urgent; Run's
// loop in rolter-proxy), delivered to the others after the delay.
func (r *run) urgentShare(p int) {
	if r.share == nil {
		return
	}
	n := r.share.nodes[p]
	select {
	case <-n.Urgent():
		if data := n.FlushUrgent(); data != nil {
			r.share.urgent++
			r.pushShare(r.now+r.cfg.ShareDelay, evShareDeliver, &shareMsg{from: p, data: data})
		}
	default:
	}
}

// fleetLoads is what proxy p's balancer sees: its own in-flight counts
// plus its peers' latest, as the proxy's pick computes them.
func (r *run) fleetLoads(p int, own []int) []int {
	if r.share == nil {
		return own
	}
	out := r.share.scratch[p]
	for i := range out {
		out[i] = own[i] + r.share.routes[p].PeerLoad(i)
	}
	return out
}
