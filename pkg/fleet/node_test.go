package fleet_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"rolter.dev/pkg/fleet"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/routing"
	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
)

const targets = 4

// member is one proxy: a fleet node with one cache_aware route.
type member struct {
	node  *fleet.Node
	route *fleet.Route
	b     routing.Balancer
	own   []int
}

func newMember(t testing.TB, id string, layout uint64) *member {
	t.Helper()
	m := &member{node: fleet.NewNode(fleet.Options{ID: id, LoadInterval: 50 * time.Millisecond, FlushInterval: 5 * time.Millisecond}), own: make([]int, targets)}
	m.route = m.node.Bind("llama", layout, targets)
	b, err := routing.New(routing.Spec{Strategy: routing.CacheAware, Weights: []int{1, 1, 1, 1}, Share: m.route.Record})
	if err != nil {
		t.Fatal(err)
	}
	m.b = b
	m.route.SetAffinity(b.(routing.SharedAffinity))
	m.route.SetOwnLoad(func(i int) int { return m.own[i] })
	return m
}

// newSoloMember is a member whose balancer does not share (a proxy
// without --share): its route still reports and takes loads.
func newSoloMember(t testing.TB) *member {
	t.Helper()
	m := newMember(t, "solo", 1)
	b, err := routing.New(routing.Spec{Strategy: routing.CacheAware, Weights: []int{1, 1, 1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	m.b = b
	m.route.SetAffinity(nil)
	return m
}

// send routes a prompt as the data plane does and returns the target.
func (m *member) send(prompt string) int {
	loads := make([]int, targets)
	for i := range loads {
		loads[i] = m.own[i] + m.route.PeerLoad(i)
	}
	t := m.b.Pick(&routing.Context{Prompt: prompt}, loads, routing.Set{})
	m.b.Observe(t, &routing.Context{Prompt: prompt})
	return t
}

func conversation(i int) string {
	return fmt.Sprintf("system %d: %s", i, strings.Repeat(fmt.Sprintf("conversation %d says hello. ", i), 30))
}

func TestObservationsMoveAffinityAcrossNodes(t *testing.T) {
	a, b := newMember(t, "a", 7), newMember(t, "b", 7)
	placed := make([]int, targets)
	for i := range targets {
		placed[i] = a.send(conversation(i))
	}
	batch := a.node.FlushObservations()
	if batch == nil {
		t.Fatal("no batch after four observations")
	}
	if a.node.FlushObservations() != nil {
		t.Fatal("a second flush with nothing new published again")
	}
	b.node.HandleObservations(batch, time.Now())
	for i := range targets {
		if got := b.send(conversation(i) + " next turn"); got != placed[i] {
			t.Errorf("conversation %d: b picked %d, a placed it on %d", i, got, placed[i])
		}
	}
	st := b.node.Stats(time.Now())
	if st.BatchesReceived != 1 || st.ChunksFolded == 0 || st.Malformed != 0 {
		t.Fatalf("receiver stats %+v", st)
	}
	if s := a.node.Stats(time.Now()); s.BatchesPublished != 1 || s.ChunksPublished != st.ChunksFolded || s.BytesPublished != uint64(len(batch)) {
		t.Fatalf("publisher stats %+v; receiver folded %d", s, st.ChunksFolded)
	}
	// A node ignores its own batches (NATS echoes them).
	a.node.HandleObservations(batch, time.Now())
	if a.node.Stats(time.Now()).BatchesReceived != 0 {
		t.Fatal("a node folded its own batch")
	}
}

func TestObservationsForAnotherLayoutAreDropped(t *testing.T) {
	a, b := newMember(t, "a", 1), newMember(t, "b", 2)
	a.send(conversation(0))
	b.node.HandleObservations(a.node.FlushObservations(), time.Now())
	st := b.node.Stats(time.Now())
	if st.UnknownRoute != 1 || st.ChunksFolded != 0 {
		t.Fatalf("stats %+v, want the entry dropped as an unknown route", st)
	}
}

func TestLostBatchesAreCounted(t *testing.T) {
	a, b := newMember(t, "a", 1), newMember(t, "b", 1)
	var batches [][]byte
	for i := range 4 {
		a.send(conversation(i))
		batches = append(batches, a.node.FlushObservations())
	}
	b.node.HandleObservations(batches[0], time.Now())
	b.node.HandleObservations(batches[3], time.Now())
	if got := b.node.Stats(time.Now()).LostBatches; got != 2 {
		t.Fatalf("lost batches %d, want 2", got)
	}
}

func TestPeerLoadsAddUpAndExpire(t *testing.T) {
	a, b, c := newMember(t, "a", 1), newMember(t, "b", 1), newMember(t, "c", 1)
	a.own[2], b.own[2], b.own[0] = 5, 3, 1
	now := time.Now()
	c.node.HandleLoads(a.node.LoadReport(), now)
	c.node.HandleLoads(b.node.LoadReport(), now)
	if got := []int{c.route.PeerLoad(0), c.route.PeerLoad(2)}; got[0] != 1 || got[1] != 8 {
		t.Fatalf("peer loads %v, want [1 8]", got)
	}
	if c.node.Stats(now).Peers != 2 {
		t.Fatal("two peers not seen")
	}
	// A newer report replaces the older one of the same peer.
	a.own[2] = 1
	c.node.HandleLoads(a.node.LoadReport(), now.Add(10*time.Millisecond))
	if got := c.route.PeerLoad(2); got != 4 {
		t.Fatalf("peer load %d after a's update, want 4", got)
	}
	// b falls silent: its counts expire after its TTL (3 × 50 ms), a's stay.
	c.node.HandleLoads(a.node.LoadReport(), now.Add(140*time.Millisecond))
	c.node.Expire(now.Add(160 * time.Millisecond))
	if got := c.route.PeerLoad(2); got != 1 {
		t.Fatalf("peer load %d after b expired, want a's 1", got)
	}
	if c.node.Stats(now.Add(160*time.Millisecond)).Peers != 1 {
		t.Fatal("a silent peer still counts as seen")
	}
	// The picks follow the fleet's load: c itself has nothing in flight.
	a.own = []int{9, 9, 0, 9}
	c.node.HandleLoads(a.node.LoadReport(), now.Add(200*time.Millisecond))
	if got := c.send("a prompt nobody has seen"); got != 2 {
		t.Fatalf("picked %d, want the only target idle fleet-wide (2)", got)
	}
}

func TestSnapshotWarmsANewNode(t *testing.T) {
	a := newMember(t, "a", 1)
	placed := make([]int, targets)
	for i := range targets {
		placed[i] = a.send(conversation(i))
	}
	a.node.FlushObservations() // the picks reach the shared index on the flush
	late := newMember(t, "late", 1)
	reply := a.node.SnapshotReply(late.node.SnapshotRequest(), 1<<20)
	if reply == nil {
		t.Fatal("no snapshot reply")
	}
	folded, err := late.node.ApplySnapshot(reply, time.Now())
	if err != nil || folded == 0 {
		t.Fatalf("apply: %d hashes, %v", folded, err)
	}
	for i := range targets {
		if got := late.send(conversation(i) + " more"); got != placed[i] {
			t.Errorf("conversation %d: warmed node picked %d, want %d", i, got, placed[i])
		}
	}
	// A node does not answer itself.
	if a.node.SnapshotReply(a.node.SnapshotRequest(), 1<<20) != nil {
		t.Fatal("a node answered its own request")
	}
}

func TestSnapshotFitsThePayloadLimit(t *testing.T) {
	a := newMember(t, "a", 1)
	for i := range 400 {
		a.send(conversation(i))
	}
	a.node.FlushObservations()
	const limit = 8 << 10
	reply := a.node.SnapshotReply(newMember(t, "b", 1).node.SnapshotRequest(), limit)
	if len(reply) > limit {
		t.Fatalf("snapshot of %d bytes, limit %d", len(reply), limit)
	}
	snap, err := fleet.DecodeSnapshot(reply)
	if err != nil || !snap.Truncated {
		t.Fatalf("decode %v, truncated %v", err, snap.GetTruncated())
	}
}

func TestMalformedInputIsCounted(t *testing.T) {
	b := newMember(t, "b", 1)
	for _, in := range [][]byte{{0xff, 0xff}, {}, []byte("garbage that is not protobuf")} {
		b.node.HandleObservations(in, time.Now())
		b.node.HandleLoads(in, time.Now())
	}
	if got := b.node.Stats(time.Now()).Malformed; got != 6 {
		t.Fatalf("malformed %d, want 6", got)
	}
	if _, err := b.node.ApplySnapshot([]byte{0xff}, time.Now()); err == nil {
		t.Fatal("a bad snapshot applied")
	}
}

// Record never blocks a request: past the queue's bound picks are dropped
// and counted, and the flush drains the queue.
func TestRecordQueueIsBounded(t *testing.T) {
	a := newMember(t, "a", 1)
	for range 4096 + 3 {
		a.route.Record(1, "a prompt routed between two flushes")
	}
	if got := a.node.Stats(time.Now()).Overflow; got != 3 {
		t.Fatalf("overflow %d, want 3", got)
	}
	if a.node.FlushObservations() == nil {
		t.Fatal("the queued picks published nothing")
	}
	a.route.Record(1, "after the flush")
	if got := a.node.Stats(time.Now()).Overflow; got != 3 {
		t.Fatalf("overflow %d after the flush drained the queue", got)
	}
	a.route.Record(targets, "out of range")
	a.route.Record(0, "")
	var nilRoute *fleet.Route
	nilRoute.Record(0, "no route")
}

// ttftMember is a proxy with one predicted_ttft route on a virtual clock.
type ttftMember struct {
	*member
	now *time.Duration
}

func newTTFTMember(t testing.TB, id string, now *time.Duration) ttftMember {
	t.Helper()
	m := newMember(t, id, 9)
	b, err := routing.New(routing.Spec{Strategy: routing.PredictedTTFT, Weights: []int{1, 1, 1, 1}, Share: m.route.Record,
		Now: func() time.Duration { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	m.b = b
	m.route.SetAffinity(b.(routing.SharedAffinity))
	m.route.SetQueue(b.(routing.SharedQueue))
	return ttftMember{m, now}
}

// avoids fails the test if m picks target for any of 40 fresh prompts
// (target has a long prefill queued, by m's peer).
func (m ttftMember) avoids(t *testing.T, target int) {
	t.Helper()
	for i := range 40 {
		if got := m.b.Pick(&routing.Context{Prompt: conversation(100 + i)}, nil, routing.Set{}); got == target {
			t.Fatalf("draw %d: picked target %d, where the peer has a long prefill queued", i, target)
		}
	}
}

// A predicted_ttft proxy's pending prefill reaches its peers (every queue
// interval): the peer routes around it, hears once that the queue emptied,
// and is then told nothing more.
func TestQueuesReachPeers(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	long := &routing.Context{Prompt: strings.Repeat("a long unrelated prompt. ", 400)}
	a.b.Observe(2, long)
	batch := a.node.FlushQueues()
	msg, err := fleet.DecodeObservations(batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Queues) != 1 || len(msg.Queues[0].Targets) != 1 || msg.Queues[0].Targets[0].Target != 2 ||
		msg.Queues[0].Targets[0].Requests != 1 || msg.QueueTtlMs == 0 {
		t.Fatalf("published queues %v (ttl %d ms), want target 2's one request", msg.Queues, msg.QueueTtlMs)
	}
	// The pick's chunks ride with the queue report, not the observation
	// flush: a peer sees where a new prefix went within a queue interval.
	if len(msg.Routes) != 1 || len(msg.Routes[0].Targets) != 1 || msg.Routes[0].Targets[0].Target != 2 ||
		len(msg.Routes[0].Targets[0].Chunks) == 0 {
		t.Fatalf("queue report's chunks %v, want the pick's at target 2", msg.Routes)
	}
	if obs := a.node.FlushObservations(); obs != nil {
		t.Fatalf("the observation flush published %d bytes for a route whose picks ride with its queue reports", len(obs))
	}
	b.node.HandleObservations(batch, time.Now())
	if st := b.node.Stats(time.Now()); st.QueueReports != 1 {
		t.Fatalf("receiver folded %d queue reports, want 1", st.QueueReports)
	}
	b.avoids(t, 2)
	// A non-empty queue is reported at every flush, so it does not expire
	// while it lasts.
	if m, _ := fleet.DecodeObservations(a.node.FlushQueues()); m == nil || len(m.Queues) != 1 {
		t.Fatalf("second flush with the prefill still pending published %v", m)
	}
	now += time.Millisecond
	a.b.(routing.TTFTObserver).FirstToken(2, long, 100*time.Millisecond, 0)
	raw := a.node.FlushQueues()
	emptied, err := fleet.DecodeObservations(raw)
	if err != nil || len(emptied.Queues) != 1 || emptied.Queues[0].Targets[0].Requests != 0 || emptied.Queues[0].Targets[0].LeaveAgeUs == nil {
		t.Fatalf("flush after the first token published %v (%v), want target 2 empty with its leave time", emptied, err)
	}
	b.node.HandleObservations(raw, time.Now())
	// (b now also holds a's prompt at target 2, sent with the queue
	// reports, so a fresh prompt's cold tie goes elsewhere: ask the queue.)
	if q := b.b.(routing.SharedQueue).PeerQueue(2); q.Requests != 0 || q.Tokens != 0 {
		t.Fatalf("after the queue emptied b still counts %d requests, %d tokens of a's at target 2", q.Requests, q.Tokens)
	}
	now += time.Second
	if batch := a.node.FlushQueues(); batch != nil {
		t.Fatalf("a flush with nothing pending and no recent first token published %d bytes", len(batch))
	}
}

// A peer's answers from a target reach the proxies whose own requests there
// have been silent: the target is serving (see routing.SilenceReporter).
func TestPeersAnswersEndSilence(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	owed := &routing.Context{Prompt: conversation(1)}
	b.b.Observe(1, owed)
	mine := &routing.Context{Prompt: conversation(2)}
	a.b.Observe(1, mine)
	now += 3 * time.Second
	silent := func() time.Duration { return b.b.(routing.SilenceReporter).Silent(nil)[1] }
	if got := silent(); got != 3*time.Second {
		t.Fatalf("b's request at target 1 unanswered for 3 s: silent %v", got)
	}
	a.b.(routing.TTFTObserver).FirstToken(1, mine, 3*time.Second, 0)
	raw := a.node.FlushQueues()
	msg, err := fleet.DecodeObservations(raw)
	if err != nil || len(msg.Queues) != 1 || msg.Queues[0].Targets[0].AnswerAgeUs == nil {
		t.Fatalf("flush after a's first token published %v (%v), want target 1 with its answer's age", msg, err)
	}
	now += 100 * time.Millisecond
	b.node.HandleObservations(raw, time.Now())
	if got := silent(); got != 0 {
		t.Fatalf("a heard from target 1 at its flush: b's silent %v, want 0 (the trip is not subtracted)", got)
	}
	now += 100 * time.Millisecond
	if got := silent(); got != 100*time.Millisecond {
		t.Fatalf("100 ms later: b's silent %v, want 100ms", got)
	}
}

// A node's place among the nodes serving a route (its rank by id, their
// number) follows the peers whose loads are live, and reaches the
// predicted_ttft balancer: c, third of three by id on 4 targets, keeps its
// tied picks to its home target 2 while it has peers, and spreads them once
// they have gone.
func TestPlaceFollowsMembership(t *testing.T) {
	now := time.Second
	a, b, c := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now), newTTFTMember(t, "c", &now)
	picks := func() map[int]bool {
		seen := map[int]bool{}
		for i := range 60 {
			seen[c.b.Pick(&routing.Context{Prompt: conversation(300 + i)}, nil, routing.Set{})] = true
		}
		return seen
	}
	if got := picks(); len(got) != targets {
		t.Fatalf("alone: picked %v, want every target", got)
	}
	at := time.Now()
	c.node.HandleLoads(a.node.LoadReport(), at)
	c.node.HandleLoads(b.node.LoadReport(), at)
	if got := picks(); len(got) != 1 || !got[2] {
		t.Fatalf("third of three: picked %v, want its home target 2 only", got)
	}
	c.node.Expire(at.Add(time.Minute))
	if got := picks(); len(got) != targets {
		t.Fatalf("peers gone: picked %v, want every target again", got)
	}
}

// residencySource is a routing.KVSharedSource over one kvindex.Residency
// per target, on the test's clock: the proxy's KV source without NATS.
type residencySource struct {
	reps []kvindex.Residency
	now  *time.Duration
}

func (s *residencySource) ids(tokenIDs []uint32) []uint64 {
	return kvindex.Identities(kvindex.Seed("llama"), tokenIDs, 16)
}

func (s *residencySource) KVScores(tokenIDs []uint32, scores []float64) bool {
	ids := s.ids(tokenIDs)
	for i := range scores {
		scores[i] = float64(s.reps[i].PrefixMatch(ids, int64(*s.now))) / float64(max(len(ids), 1))
	}
	return true
}

func (s *residencySource) Speculate(target int, tokenIDs []uint32, ttl time.Duration) {
	s.reps[target].Speculate(s.ids(tokenIDs), int64(*s.now), ttl)
}

func (s *residencySource) SpeculateAppend(target int, tokenIDs []uint32, ttl time.Duration, dst []uint64) []uint64 {
	return s.reps[target].SpeculateAppend(s.ids(tokenIDs), int64(*s.now), ttl, dst)
}

func (s *residencySource) SpeculateIDs(target int, ids []uint64, ttl time.Duration) {
	s.reps[target].Speculate(ids, int64(*s.now), ttl)
}

// A predicted_ttft proxy's pick speculates the request's KV blocks at its
// target, and its next queue report passes them on: the peer counts the
// prefix there before the engine has prefilled it and its events arrived
// (in the routing simulator, 4 proxies behind a 1 s client ramp lost 15 %
// of one proxy's TTFT to picks their peers could not see).
func TestSpeculationReachesPeers(t *testing.T) {
	now := time.Second
	member := func(id string) (ttftMember, *residencySource) {
		m := newMember(t, id, 9)
		src := &residencySource{reps: make([]kvindex.Residency, targets), now: &now}
		b, err := routing.New(routing.Spec{Strategy: routing.PredictedTTFT, Weights: []int{1, 1, 1, 1}, Share: m.route.Record,
			KV: src, Now: func() time.Duration { return now }})
		if err != nil {
			t.Fatal(err)
		}
		m.b = b
		m.route.SetAffinity(b.(routing.SharedAffinity))
		m.route.SetQueue(b.(routing.SharedQueue))
		return ttftMember{m, &now}, src
	}
	a, _ := member("a")
	b, bsrc := member("b")
	tokens := make([]uint32, 64*16)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	ctx := &routing.Context{Prompt: conversation(1), TokenIDs: tokens}
	a.b.Observe(2, ctx)
	raw := a.node.FlushQueues()
	msg, err := fleet.DecodeObservations(raw)
	if err != nil || len(msg.Queues) != 1 || len(msg.Queues[0].Targets) != 1 || len(msg.Queues[0].Targets[0].KvBlocks) != 64 {
		t.Fatalf("a's queue report after its pick: %v (%v), want target 2 with the request's 64 blocks", msg, err)
	}
	b.node.HandleObservations(raw, time.Now())
	if st := b.node.Stats(time.Now()); st.BlocksSpeculated != 64 {
		t.Fatalf("b folded %d speculated blocks, want 64", st.BlocksSpeculated)
	}
	scores := make([]float64, targets)
	bsrc.KVScores(tokens, scores)
	if scores[2] != 1 || scores[0]+scores[1]+scores[3] != 0 {
		t.Fatalf("b's view of the prefix after a's report: %v, want all of it at target 2 only", scores)
	}
	// Taken once: the next report carries no blocks.
	if m, _ := fleet.DecodeObservations(a.node.FlushQueues()); m == nil || len(m.Queues) != 1 || len(m.Queues[0].Targets[0].KvBlocks) != 0 {
		t.Fatalf("second report: %v, want the pending request without its blocks again", m)
	}
	// The speculation lasts b's own TTL.
	now += routing.DefaultSpeculativeTTL
	bsrc.KVScores(tokens, scores)
	if scores[2] != 0 {
		t.Fatalf("after the speculative TTL b still sees %v of the prefix at target 2", scores[2])
	}
}

// arrivalsProbe is a queue-sharing balancer that records the peers'
// arrivals folded into it.
type arrivalsProbe struct {
	routing.SharedQueue
	folded []time.Duration
}

func (p *arrivalsProbe) TakeArrivals(dst []time.Duration) []time.Duration { return dst }
func (p *arrivalsProbe) FoldPeerArrivals(ages []time.Duration) {
	p.folded = append(p.folded, ages...)
}

// A predicted_ttft proxy's arrivals ride with its queue reports, by their
// ages at the report, whether or not anything is queued, and reach the
// peer's balancer; taken once.
func TestArrivalsReachPeers(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	a.b.(routing.SharedQueue).SetPlace(0, 2)
	probe := &arrivalsProbe{SharedQueue: b.b.(routing.SharedQueue)}
	b.route.SetQueue(probe)
	for range 2 {
		a.b.(routing.Deferrer).Defer(&routing.Context{Prompt: conversation(1)}, nil, routing.Set{})
		now += 3 * time.Millisecond
	}
	raw := a.node.FlushQueues()
	msg, err := fleet.DecodeObservations(raw)
	if err != nil || len(msg.Queues) != 1 || !slices.Equal(msg.Queues[0].ArrivalAgesUs, []uint32{6000, 3000}) {
		t.Fatalf("a's report after two arrivals 3 ms apart, nothing picked: %v (%v), want their ages 6,000 and 3,000 µs", msg, err)
	}
	b.node.HandleObservations(raw, time.Now())
	if want := []time.Duration{6 * time.Millisecond, 3 * time.Millisecond}; !slices.Equal(probe.folded, want) {
		t.Fatalf("b's balancer folded %v, want %v", probe.folded, want)
	}
	if st := b.node.Stats(time.Now()); st.Arrivals != 2 {
		t.Fatalf("b counted %d arrivals, want 2", st.Arrivals)
	}
	if again := a.node.FlushQueues(); again != nil {
		t.Fatalf("a second report with no new arrival: %v", again)
	}
}

// pacedProbe is a queue-sharing balancer that records what the fleet tells
// it of its peers' reports: their interval, their trip and their arrivals.
type pacedProbe struct {
	routing.SharedQueue
	interval, trip, clock time.Duration
	folded                []time.Duration
}

func (p *pacedProbe) SetFleetClockOffset(d time.Duration) { p.clock = d }

func (p *pacedProbe) SetReportInterval(d time.Duration) { p.interval = d }
func (p *pacedProbe) SetReportTrip(d time.Duration)     { p.trip = d }
func (p *pacedProbe) TakeArrivals(dst []time.Duration) []time.Duration {
	return p.SharedQueue.(routing.SharedArrivals).TakeArrivals(dst)
}
func (p *pacedProbe) FoldPeerArrivals(ages []time.Duration) {
	p.folded = append(p.folded, ages...)
}

// at is the wall-clock instant ms milliseconds into the load reports'
// tests (any fixed instant: the nodes read only differences of it, and
// the clocks their reports carry).
func at(ms int) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(ms) * time.Millisecond)
}

// Each proxy measures the trip of its messages from the peers' echoes of
// its load reports (less the time a peer held one), tells its balancer, and
// ages the peers' arrivals by it; a peer that goes silent takes its trip
// with it.
func TestTripMeasuredFromEchoes(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	pa, pb := &pacedProbe{SharedQueue: a.b.(routing.SharedQueue)}, &pacedProbe{SharedQueue: b.b.(routing.SharedQueue)}
	a.route.SetQueue(pa)
	b.route.SetQueue(pb)
	if pa.interval != fleet.DefaultQueueInterval || pa.trip != 0 {
		t.Fatalf("before any echo: interval %v, trip %v; want %v, 0", pa.interval, pa.trip, fleet.DefaultQueueInterval)
	}
	// a → b takes 4 ms, b holds a's report 30 ms before its own, which
	// takes 4 ms back: a measures 8 ms there and back.
	b.node.HandleLoads(a.node.LoadReportAt(at(0)), at(4))
	a.node.HandleLoads(b.node.LoadReportAt(at(34)), at(38))
	if pa.trip != 4*time.Millisecond {
		t.Fatalf("a's trip after b's echo: %v, want 4ms", pa.trip)
	}
	// And b from a's next report, which echoes b's.
	b.node.HandleLoads(a.node.LoadReportAt(at(100)), at(104))
	if pb.trip != 4*time.Millisecond {
		t.Fatalf("b's trip after a's echo: %v, want 4ms", pb.trip)
	}
	// A slower round trip moves the estimate an eighth of the way.
	a.node.HandleLoads(b.node.LoadReportAt(at(134)), at(150))
	if want := 4*time.Millisecond + 750*time.Microsecond; pa.trip != want {
		t.Fatalf("a's trip after a 20 ms round trip: %v, want %v", pa.trip, want)
	}
	// An echo of a report a never sent, or held longer than a's report
	// has been out, measures nothing.
	forged := mustEncode(&fleetv1.Loads{Proxy: "b", Seq: 99, TtlMs: 300, Echoes: []*fleetv1.Echo{{Proxy: "a", Seq: 77, HeldUs: 1}}})
	a.node.HandleLoads(forged, at(160))
	a.node.LoadReportAt(at(200))
	late := mustEncode(&fleetv1.Loads{Proxy: "b", Seq: 100, TtlMs: 300, Echoes: []*fleetv1.Echo{{Proxy: "a", Seq: 3, HeldUs: 60_000}}})
	a.node.HandleLoads(late, at(210))
	// Nor does a round trip as long as a load report stays valid (300 ms).
	slow := mustEncode(&fleetv1.Loads{Proxy: "b", Seq: 101, TtlMs: 300, Echoes: []*fleetv1.Echo{{Proxy: "a", Seq: 3, HeldUs: 0}}})
	a.node.HandleLoads(slow, at(500))
	if want := 4*time.Millisecond + 750*time.Microsecond; pa.trip != want {
		t.Fatalf("a's trip after forged echoes: %v, want %v", pa.trip, want)
	}

	// b's arrivals reach a aged by the trip: 3 ms at b's report, 4.75 ms
	// on the way.
	b.b.(routing.Deferrer).Defer(&routing.Context{Prompt: conversation(1)}, nil, routing.Set{})
	now += 3 * time.Millisecond
	a.node.HandleObservations(b.node.FlushQueues(), at(505))
	if want := []time.Duration{7*time.Millisecond + 750*time.Microsecond}; !slices.Equal(pa.folded, want) {
		t.Fatalf("a folded b's arrivals as %v, want %v", pa.folded, want)
	}

	// b falls silent: once its loads expire a has no trip.
	a.node.Expire(at(500 + 3*int(fleet.DefaultLoadInterval/time.Millisecond)))
	if pa.trip != 0 {
		t.Fatalf("a's trip after b expired: %v, want 0", pa.trip)
	}
}

// A peer that restarts under the same id counts its load reports from 1
// again; the echoes follow it, and it measures its trip at once.
func TestTripAfterAPeerRestarts(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	for i := range 5 {
		a.node.HandleLoads(b.node.LoadReportAt(at(100*i)), at(100*i+2))
	}
	again := newTTFTMember(t, "b", &now)
	probe := &pacedProbe{SharedQueue: again.b.(routing.SharedQueue)}
	again.route.SetQueue(probe)
	a.node.HandleLoads(again.node.LoadReportAt(at(600)), at(602))
	again.node.HandleLoads(a.node.LoadReportAt(at(650)), at(652))
	if probe.trip != 2*time.Millisecond {
		t.Fatalf("the restarted peer's trip: %v, want 2ms", probe.trip)
	}
}

// Each proxy measures how far a live peer's wall clock is from its own,
// from the clock the peer's load reports carry and half the round trip
// (NTP's reckoning), smoothed by an eighth; the largest either way shows in
// Stats. Nothing is taken before the round trip is known, nor from a peer
// that sends no clock; a clock days off shows as a day.
func TestClockOffsetMeasured(t *testing.T) {
	now := time.Second
	a, b := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now)
	// b's clock runs 7 ms ahead of a's: b stamps its reports 7 ms later
	// than a's clock reads, and a message takes 4 ms either way.
	ahead := 7 * time.Millisecond
	a.node.HandleLoads(b.node.LoadReportAt(at(-66).Add(ahead)), at(-62))
	if got := a.node.Stats(at(-62)).ClockOffset; got != 0 {
		t.Fatalf("offset before any round trip: %v, want none", got)
	}
	b.node.HandleLoads(a.node.LoadReportAt(at(0)), at(4).Add(ahead))
	a.node.HandleLoads(b.node.LoadReportAt(at(34).Add(ahead)), at(38)) // its echo gives the round trip
	if got := a.node.Stats(at(38)).ClockOffset; got != ahead {
		t.Fatalf("a's offset to b: %v, want %v", got, ahead)
	}
	a.node.HandleLoads(b.node.LoadReportAt(at(134).Add(ahead)), at(138))
	if got := a.node.Stats(at(138)).ClockOffset; got != ahead {
		t.Fatalf("a's offset to b, again: %v, want %v", got, ahead)
	}
	// b moves 8 ms further ahead: an eighth of it shows at the next report.
	a.node.HandleLoads(b.node.LoadReportAt(at(234).Add(ahead+8*time.Millisecond)), at(238))
	if got, want := a.node.Stats(at(238)).ClockOffset, ahead+time.Millisecond; got != want {
		t.Fatalf("after b jumped 8 ms: %v, want %v", got, want)
	}
	// A peer without a clock changes nothing; one stamped years off is a
	// day off, and the smoothing stays finite.
	a.node.HandleLoads(mustEncode(&fleetv1.Loads{Proxy: "b", Seq: 50, TtlMs: 300}), at(300))
	if got, want := a.node.Stats(at(300)).ClockOffset, ahead+time.Millisecond; got != want {
		t.Fatalf("after a report without a clock: %v, want %v", got, want)
	}
	for k := range 100 {
		a.node.HandleLoads(mustEncode(&fleetv1.Loads{Proxy: "b", Seq: uint64(51 + k), TtlMs: 300, SentUnixUs: math.MinInt64}), at(300))
	}
	if got := a.node.Stats(at(300)).ClockOffset; got <= 23*time.Hour || got > 24*time.Hour {
		t.Fatalf("a peer stamped at the epoch's far end: offset %v, want about a day", got)
	}
	// Once b's loads expire its offset no longer shows.
	if got := a.node.Stats(at(300 + 3*int(fleet.DefaultLoadInterval/time.Millisecond))).ClockOffset; got != 0 {
		t.Fatalf("after b expired: %v, want 0", got)
	}
}

// The proxies set their turns' clock to the reference proxy's, the live
// one with the smallest id: each hands its balancer how far that clock runs
// ahead of its own (the reference, 0); a reference that goes silent hands
// the part to the next.
func TestFleetClockFollowsTheReference(t *testing.T) {
	now := time.Second
	a, b, c := newTTFTMember(t, "a", &now), newTTFTMember(t, "b", &now), newTTFTMember(t, "c", &now)
	pa, pb, pc := &pacedProbe{SharedQueue: a.b.(routing.SharedQueue)}, &pacedProbe{SharedQueue: b.b.(routing.SharedQueue)}, &pacedProbe{SharedQueue: c.b.(routing.SharedQueue)}
	a.route.SetQueue(pa)
	b.route.SetQueue(pb)
	c.route.SetQueue(pc)
	// a's clock is the true one; b's runs 7 ms ahead, c's 3 ms behind; a
	// message takes 2 ms.
	skew := map[*member]time.Duration{a.member: 0, b.member: 7 * time.Millisecond, c.member: -3 * time.Millisecond}
	members := []*member{a.member, b.member, c.member}
	round := func(ms int) {
		sent := at(ms)
		reports := make([][]byte, len(members))
		for i, m := range members {
			reports[i] = m.node.LoadReportAt(sent.Add(skew[m]))
		}
		for i, data := range reports {
			for j, m := range members {
				if i != j {
					m.node.HandleLoads(data, sent.Add(2*time.Millisecond+skew[m]))
				}
			}
		}
	}
	for k := range 3 {
		round(100 * k)
	}
	if pa.clock != 0 || pb.clock != -7*time.Millisecond || pc.clock != 3*time.Millisecond {
		t.Fatalf("clock offsets handed on: a %v, b %v, c %v; want 0, -7ms, 3ms (a's clock)", pa.clock, pb.clock, pc.clock)
	}
	// a falls silent: b, the smallest id left, is the reference.
	members = []*member{b.member, c.member}
	for _, m := range members {
		m.node.Expire(at(1000).Add(skew[m]))
	}
	for k := range 3 {
		round(1100 + 100*k)
	}
	if pb.clock != 0 || pc.clock != 10*time.Millisecond {
		t.Fatalf("without a: b %v, c %v; want 0 and 10ms (b's clock)", pb.clock, pc.clock)
	}
}

func mustEncode(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}
