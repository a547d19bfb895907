package vllmsim_test

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"rolter.dev/pkg/kvevents"
	"rolter.dev/tests/vllmsim"
)

const kvTopic = "kv@pod-a@sim-model"

// newKVPublisher starts a publisher bound to an ephemeral local port, closed
// when the test ends.
func newKVPublisher(t *testing.T, opts vllmsim.KVPublisherOptions) *vllmsim.KVPublisher {
	t.Helper()
	if opts.Endpoint == "" {
		opts.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := vllmsim.NewKVPublisher(opts)
	if err != nil {
		t.Fatalf("NewKVPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// newSub connects a zmq4 SUB to endpoint with the topic filter and waits
// until the publisher has its subscription, so that nothing published after
// it returns is missed.
func newSub(t *testing.T, p *vllmsim.KVPublisher, endpoint, filter string) zmq4.Socket {
	t.Helper()
	before := p.Stats().Subscribers
	sub := zmq4.NewSub(context.Background())
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.Dial(endpoint); err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, filter); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	waitFor(t, "subscription", func() bool { return p.Stats().Subscribers > before })
	return sub
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recvMsgs receives n live messages, each decoded.
func recvMsgs(t *testing.T, sub zmq4.Socket, n int) ([]kvevents.Message, []*kvevents.Batch) {
	t.Helper()
	type result struct {
		msg zmq4.Msg
		err error
	}
	var msgs []kvevents.Message
	var batches []*kvevents.Batch
	for range n {
		c := make(chan result, 1)
		go func() { m, err := sub.Recv(); c <- result{m, err} }()
		var r result
		select {
		case r = <-c:
		case <-time.After(5 * time.Second):
			_ = sub.Close() // unblocks Recv
			<-c
			t.Fatalf("timed out after %d of %d messages", len(msgs), n)
		}
		if r.err != nil {
			t.Fatalf("recv: %v", r.err)
		}
		m, err := kvevents.ParseMessage(r.msg.Frames)
		if err != nil {
			t.Fatalf("message %d: %v", len(msgs), err)
		}
		b, err := kvevents.Decode(m.Payload)
		if err != nil {
			t.Fatalf("message %d: decode: %v", len(msgs), err)
		}
		if b.UnknownEvents+b.InvalidEvents+b.UnknownFields != 0 {
			t.Errorf("message %d: skipped parts: %+v", len(msgs), b)
		}
		msgs, batches = append(msgs, m), append(batches, b)
	}
	return msgs, batches
}

// recorder is a Listener that keeps the cache's operations and forwards
// them to a publisher.
type recorder struct {
	mu   sync.Mutex
	ops  [][]vllmsim.KVEvent
	next vllmsim.Listener
}

func (r *recorder) KVEvents(batch []vllmsim.KVEvent) {
	r.mu.Lock()
	r.ops = append(r.ops, slices.Clone(batch))
	r.mu.Unlock()
	r.next.KVEvents(batch)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

// fromWire converts a decoded batch back to the cache's events.
func fromWire(t *testing.T, b *kvevents.Batch) []vllmsim.KVEvent {
	t.Helper()
	var out []vllmsim.KVEvent
	keys := func(hs []kvevents.Hash) []uint64 {
		ks := make([]uint64, len(hs))
		for i, h := range hs {
			if h.Form() != kvevents.HashUint {
				t.Errorf("hash %v sent as %v, want an unsigned int", h, h.Form())
			}
			ks[i] = h.Uint64()
		}
		return ks
	}
	for _, e := range b.Events {
		switch e := e.(type) {
		case *kvevents.BlockStored:
			ev := vllmsim.KVEvent{Kind: vllmsim.BlockStored, BlockHashes: keys(e.BlockHashes), TokenIDs: e.TokenIDs, BlockSize: e.BlockSize}
			if e.ParentBlockHash.Valid {
				ev.ParentBlockHash, ev.HasParent = e.ParentBlockHash.V.Uint64(), true
			}
			for i, k := range e.ExtraKeys {
				v, err := k.Value()
				salt, ok := v.([]any)
				switch {
				case k == nil:
				case err != nil || i > 0 || ev.HasParent || !ok || len(salt) != 1:
					t.Errorf("extra key %d of a run (parent %v): %v, %v", i, ev.HasParent, v, err)
				default:
					ev.Salt, _ = salt[0].(string)
				}
			}
			out = append(out, ev)
		case *kvevents.BlockRemoved:
			out = append(out, vllmsim.KVEvent{Kind: vllmsim.BlockRemoved, BlockHashes: keys(e.BlockHashes)})
		case *kvevents.AllBlocksCleared:
			out = append(out, vllmsim.KVEvent{Kind: vllmsim.AllBlocksCleared})
		}
	}
	return out
}

func seqTokens(from, n uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

// exercise runs cache operations that store, extend, evict and clear.
func exercise(c *vllmsim.Cache) {
	_, l1 := c.Admit(seqTokens(1, 10)) // 2 blocks of 4
	c.Release(l1)
	_, l2 := c.Admit(append(seqTokens(1, 4), seqTokens(100, 8)...)) // shares block 0, stores 2 with a parent
	c.Extend(l2, append(append(seqTokens(1, 4), seqTokens(100, 8)...), seqTokens(500, 4)...))
	c.Release(l2)
	_, l3 := c.Admit(seqTokens(1000, 16)) // 4 new blocks: evicts
	c.Release(l3)
	c.Clear()
	_, l4 := c.Admit(seqTokens(1, 8))
	c.Release(l4)
}

// TestKVPublisherLiveEvents checks, for both forms, that a SUB receives one
// batch per cache operation with contiguous sequence numbers from 0, in
// vLLM's frames, decoding to events that mirror the cache.
func TestKVPublisherLiveEvents(t *testing.T) {
	for _, format := range []string{"array", "map"} {
		t.Run(format, func(t *testing.T) {
			layout, err := vllmsim.ParseKVFormat(format)
			if err != nil {
				t.Fatal(err)
			}
			p := newKVPublisher(t, vllmsim.KVPublisherOptions{Topic: kvTopic, Layout: layout, DataParallelRank: 2})
			sub := newSub(t, p, p.Endpoint(), "kv@")
			rec := &recorder{next: p}
			cache := vllmsim.NewCache(4, 6, rec)
			exercise(cache)

			msgs, batches := recvMsgs(t, sub, rec.count())
			m := &mirror{t: t, blockSize: 4, blocks: map[uint64]bool{}}
			var kinds []vllmsim.KVEventKind
			for i, b := range batches {
				if string(msgs[i].Topic) != kvTopic || msgs[i].Seq != uint64(i) {
					t.Errorf("message %d: topic %q seq %d", i, msgs[i].Topic, msgs[i].Seq)
				}
				if b.Layout.Form != layout.Form || b.DataParallelRank != kvevents.Some[int64](2) {
					t.Errorf("message %d: layout %+v rank %v", i, b.Layout, b.DataParallelRank)
				}
				if layout.Form == kvevents.FormArray && (b.Layout.StoredLen != 0 && b.Layout.StoredLen != 12 || b.Layout.RemovedLen != 0 && b.Layout.RemovedLen != 4) {
					t.Errorf("message %d: array lengths %+v, want vLLM 0.22's 12 and 4", i, b.Layout)
				}
				if d := time.Since(time.Unix(0, int64(b.TS*1e9))); d < 0 || d > time.Minute {
					t.Errorf("message %d: ts %v is %v ago", i, b.TS, d)
				}
				got := fromWire(t, b)
				if want := rec.ops[i]; !slices.EqualFunc(got, want, sameEvent) {
					t.Errorf("message %d: events %+v, want %+v", i, got, want)
				}
				for _, e := range b.Events {
					switch e := e.(type) {
					case *kvevents.BlockStored:
						want := kvevents.BlockStored{Medium: kvevents.Some("GPU"), GroupIdx: kvevents.Some[int64](0),
							KVCacheSpecKind: kvevents.Some("full_attention")}
						if e.Medium != want.Medium || e.GroupIdx != want.GroupIdx || e.KVCacheSpecKind != want.KVCacheSpecKind ||
							len(e.ExtraKeys) != len(e.BlockHashes) || slices.ContainsFunc(e.ExtraKeys, func(k kvevents.ExtraKey) bool { return k != nil }) || e.LoRAID.Valid || e.LoRAName.Valid || e.BlockSize != 4 {
							t.Errorf("message %d: BlockStored fields %+v", i, e)
						}
					case *kvevents.BlockRemoved:
						if e.Medium != kvevents.Some("GPU") || e.GroupIdx != kvevents.Some[int64](0) {
							t.Errorf("message %d: BlockRemoved fields %+v", i, e)
						}
					}
				}
				m.KVEvents(got)
				for _, e := range got {
					kinds = append(kinds, e.Kind)
				}
			}
			m.check(cache)
			for _, k := range []vllmsim.KVEventKind{vllmsim.BlockStored, vllmsim.BlockRemoved, vllmsim.AllBlocksCleared} {
				if !slices.Contains(kinds, k) {
					t.Errorf("no %v event among %v", k, kinds)
				}
			}
			if st := p.Stats(); st.Published != uint64(len(msgs)) || st.Dropped != 0 || st.SubscriberDrops != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func sameEvent(a, b vllmsim.KVEvent) bool {
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.HasParent == b.HasParent &&
		a.ParentBlockHash == b.ParentBlockHash && slices.Equal(a.TokenIDs, b.TokenIDs) && a.BlockSize == b.BlockSize && a.Salt == b.Salt
}

// TestKVPublisherSaltedRun: a salted prompt's blocks are published with
// the salt as the extra keys of its first block, (cache_salt,) as vLLM
// writes them, and its later blocks and an unsalted prompt's with none.
func TestKVPublisherSaltedRun(t *testing.T) {
	layout, err := vllmsim.ParseKVFormat("array")
	if err != nil {
		t.Fatal(err)
	}
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{Topic: kvTopic, Layout: layout})
	sub := newSub(t, p, p.Endpoint(), "kv@")
	rec := &recorder{next: p}
	cache := vllmsim.NewCache(4, 100, rec)
	_, salted := cache.AdmitSalted(seqTokens(1, 10), "tenant-a")
	cache.Extend(salted, seqTokens(1, 14))
	cache.Admit(seqTokens(1, 10))
	_, batches := recvMsgs(t, sub, rec.count())
	var got []vllmsim.KVEvent
	for _, b := range batches {
		got = append(got, fromWire(t, b)...)
	}
	want := []vllmsim.KVEvent{
		{Kind: vllmsim.BlockStored, BlockHashes: vllmsim.SaltedBlockHashes(seqTokens(1, 10), 4, "tenant-a"), TokenIDs: seqTokens(1, 8), BlockSize: 4, Salt: "tenant-a"},
		{Kind: vllmsim.BlockStored, BlockHashes: vllmsim.SaltedBlockHashes(seqTokens(1, 14), 4, "tenant-a")[2:], TokenIDs: seqTokens(9, 4), BlockSize: 4,
			HasParent: true, ParentBlockHash: vllmsim.SaltedBlockHashes(seqTokens(1, 8), 4, "tenant-a")[1]},
		{Kind: vllmsim.BlockStored, BlockHashes: vllmsim.BlockHashes(seqTokens(1, 10), 4), TokenIDs: seqTokens(1, 8), BlockSize: 4},
	}
	if !slices.EqualFunc(got, want, sameEvent) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
}

// TestKVPublisherTopicFilter checks that a SUB whose filter does not match
// the topic receives nothing, while a matching one does.
func TestKVPublisherTopicFilter(t *testing.T) {
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{Topic: kvTopic})
	other := newSub(t, p, p.Endpoint(), "kv@pod-b")
	sub := newSub(t, p, p.Endpoint(), "")
	c := vllmsim.NewCache(4, 8, p)
	c.Admit(seqTokens(1, 8))
	recvMsgs(t, sub, 1)
	got := make(chan struct{})
	go func() {
		if _, err := other.Recv(); err == nil {
			close(got)
		}
	}()
	select {
	case <-got:
		t.Error("a SUB filtering on another topic received a message")
	case <-time.After(100 * time.Millisecond):
	}
	_ = other.Close()
}

// replay sends a replay request from a DEALER and collects the replies up
// to the end marker.
func replay(t *testing.T, endpoint string, start uint64) (msgs []kvevents.Message, frames [][][]byte) {
	t.Helper()
	dealer := zmq4.NewDealer(context.Background())
	defer dealer.Close()
	if err := dealer.Dial(endpoint); err != nil {
		t.Fatalf("dial replay: %v", err)
	}
	if err := dealer.Send(zmq4.NewMsgFrom(kvevents.ReplayRequest(start)...)); err != nil {
		t.Fatalf("send replay request: %v", err)
	}
	type result struct {
		msg zmq4.Msg
		err error
	}
	for {
		c := make(chan result, 1)
		go func() { m, err := dealer.Recv(); c <- result{m, err} }()
		var r result
		select {
		case r = <-c:
		case <-time.After(5 * time.Second):
			_ = dealer.Close()
			<-c
			t.Fatalf("replay from %d: timed out after %d replies", start, len(msgs))
		}
		if r.err != nil {
			t.Fatalf("replay recv: %v", r.err)
		}
		frames = append(frames, r.msg.Frames)
		m, end, err := kvevents.ParseReplayReply(r.msg.Frames)
		if err != nil {
			t.Fatalf("replay reply: %v", err)
		}
		if end {
			return msgs, frames
		}
		msgs = append(msgs, m)
	}
}

// TestKVPublisherReplay checks the replay socket: the batches from the
// requested sequence on, byte for byte as published, then the end marker;
// the oldest kept when the request is older than the buffer; only the end
// marker for a future sequence; both reply layouts.
func TestKVPublisherReplay(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := map[bool]string{false: "with topic (vLLM ≥ 0.26)", true: "legacy (vLLM ≤ 0.25)"}[legacy]
		t.Run(name, func(t *testing.T) {
			p := newKVPublisher(t, vllmsim.KVPublisherOptions{
				Topic: kvTopic, ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 4, LegacyReplay: legacy, Layout: kvevents.LayoutMap,
			})
			sub := newSub(t, p, p.Endpoint(), "")
			rec := &recorder{next: p}
			exercise(vllmsim.NewCache(4, 6, rec))
			n := rec.count()
			if n < 6 {
				t.Fatalf("only %d operations", n)
			}
			live, _ := recvMsgs(t, sub, n)
			waitFor(t, "publishing", func() bool { return p.Stats().Published == uint64(n) })

			got, frames := replay(t, p.ReplayEndpoint(), uint64(n-3))
			if len(got) != 3 {
				t.Fatalf("replay from %d: %d messages, want 3", n-3, len(got))
			}
			for i, m := range got {
				want := live[n-3+i]
				if m.Seq != want.Seq || string(m.Payload) != string(want.Payload) {
					t.Errorf("replayed seq %d, want %d (payload equal: %v)", m.Seq, want.Seq, string(m.Payload) == string(want.Payload))
				}
				wantFrames := 4
				if legacy {
					wantFrames = 3
				} else if string(m.Topic) != kvTopic {
					t.Errorf("replayed topic %q", m.Topic)
				}
				if len(frames[i]) != wantFrames {
					t.Errorf("reply of %d frames, want %d", len(frames[i]), wantFrames)
				}
			}
			end := frames[len(frames)-1]
			if want := kvevents.ReplayEnd(map[bool]kvevents.ReplayFormat{false: kvevents.ReplayWithTopic, true: kvevents.ReplayLegacy}[legacy]); !slices.EqualFunc(end, want, func(a, b []byte) bool { return string(a) == string(b) }) {
				t.Errorf("end marker %x, want %x", end, want)
			}

			// Older than the buffer (4 batches): starts at the oldest kept.
			got, _ = replay(t, p.ReplayEndpoint(), 0)
			if len(got) != 4 || got[0].Seq != uint64(n-4) {
				t.Errorf("replay from 0: %d messages from %d, want 4 from %d", len(got), got[0].Seq, n-4)
			}
			// A future sequence: only the end marker.
			if got, _ = replay(t, p.ReplayEndpoint(), uint64(n+10)); len(got) != 0 {
				t.Errorf("replay from the future: %d messages", len(got))
			}
			if st := p.Stats(); st.ReplayRequests != 3 {
				t.Errorf("replay requests %d, want 3", st.ReplayRequests)
			}
		})
	}
}

// TestKVPublisherRestartStartsAtZero checks that a publisher restarted on
// the same endpoint numbers its batches from 0 again, as vLLM does.
func TestKVPublisherRestartStartsAtZero(t *testing.T) {
	p1, err := vllmsim.NewKVPublisher(vllmsim.KVPublisherOptions{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := p1.Endpoint()
	sub := newSub(t, p1, endpoint, "")
	c := vllmsim.NewCache(4, 64, p1)
	c.Admit(seqTokens(1, 8))
	c.Admit(seqTokens(100, 8))
	msgs, _ := recvMsgs(t, sub, 2)
	if msgs[0].Seq != 0 || msgs[1].Seq != 1 {
		t.Fatalf("first run: seqs %d, %d", msgs[0].Seq, msgs[1].Seq)
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	_ = sub.Close()

	p2 := newKVPublisher(t, vllmsim.KVPublisherOptions{Endpoint: endpoint})
	sub2 := newSub(t, p2, endpoint, "")
	c2 := vllmsim.NewCache(4, 64, p2)
	c2.Admit(seqTokens(1, 8))
	msgs, _ = recvMsgs(t, sub2, 1)
	if msgs[0].Seq != 0 {
		t.Errorf("after restart: seq %d, want 0", msgs[0].Seq)
	}
}

// TestKVPublisherConnectMode checks the centralised mode: the watcher binds
// and the simulator connects (and reconnects) to it.
func TestKVPublisherConnectMode(t *testing.T) {
	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + sub.Addr().String()
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{Endpoint: endpoint, Connect: true, Topic: kvTopic})
	if p.Endpoint() != endpoint {
		t.Errorf("Endpoint() = %q, want %q", p.Endpoint(), endpoint)
	}
	waitFor(t, "connection", func() bool { return p.Stats().Subscribers == 1 })
	c := vllmsim.NewCache(4, 64, p)
	c.Admit(seqTokens(1, 8))
	c.Clear()
	_, batches := recvMsgs(t, sub, 2)
	if _, ok := batches[0].Events[0].(*kvevents.BlockStored); !ok {
		t.Errorf("first event %T", batches[0].Events[0])
	}
	if _, ok := batches[1].Events[0].(*kvevents.AllBlocksCleared); !ok {
		t.Errorf("second event %T", batches[1].Events[0])
	}
}

// TestKVPublisherServer wires a publisher into a simulated replica through
// Options.Listener: a completion stores its prompt's blocks, /sim/reset
// clears them.
func TestKVPublisherServer(t *testing.T) {
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{Layout: kvevents.LayoutMap})
	sub := newSub(t, p, p.Endpoint(), "")
	_, ts := newServer(t, vllmsim.Options{BlockSize: 4, Listener: p})
	post(t, ts, "/v1/completions", mustJSON(t, map[string]any{"max_tokens": 1, "prompt": strings.Repeat("kv events ", 8)}), http.StatusOK)
	_, batches := recvMsgs(t, sub, 1)
	stored, ok := batches[0].Events[0].(*kvevents.BlockStored)
	if !ok || stored.ParentBlockHash.Valid || len(stored.BlockHashes) == 0 {
		t.Fatalf("completion: events %+v", batches[0].Events)
	}
	want := vllmsim.BlockHashes(stored.TokenIDs, 4)
	for i, h := range stored.BlockHashes {
		if h.Uint64() != want[i] {
			t.Errorf("block %d: hash %v, want the chained hash %x of its tokens", i, h, want[i])
		}
	}
	post(t, ts, "/sim/reset", "", http.StatusOK)
	_, batches = recvMsgs(t, sub, 1)
	if _, ok := batches[0].Events[0].(*kvevents.AllBlocksCleared); !ok || len(batches[0].Events) != 1 {
		t.Errorf("reset: events %+v", batches[0].Events)
	}
}

// TestKVPublisherNeverBlocks checks that reporting events never waits: a
// full queue and a closed publisher drop (and count) operations.
func TestKVPublisherNeverBlocks(t *testing.T) {
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{QueueSize: 1})
	ev := []vllmsim.KVEvent{{Kind: vllmsim.AllBlocksCleared}}
	for range 10000 {
		p.KVEvents(ev)
	}
	_ = p.Close()
	st := p.Stats()
	if st.Published+st.Dropped != 10000 {
		t.Errorf("published %d + dropped %d != 10000", st.Published, st.Dropped)
	}
	p.KVEvents(ev)
	if p.Stats().Dropped != st.Dropped+1 {
		t.Error("an operation after Close was not counted as dropped")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestKVPublisherOptions(t *testing.T) {
	bad := []vllmsim.KVPublisherOptions{
		{Endpoint: "127.0.0.1:5557"},
		{Endpoint: "udp://127.0.0.1:0"},
		{Endpoint: "tcp://nohostport"},
		{Endpoint: "ipc://"},
		{Endpoint: "tcp://127.0.0.1:0", Layout: kvevents.Layout{Form: 7}},
		{Endpoint: "tcp://127.0.0.1:0", Layout: kvevents.Layout{Form: kvevents.FormArray, StoredLen: 3}},
		{Endpoint: "tcp://127.0.0.1:0", QueueSize: -1},
		{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "bogus"},
	}
	for _, o := range bad {
		if p, err := vllmsim.NewKVPublisher(o); err == nil {
			_ = p.Close()
			t.Errorf("NewKVPublisher(%+v) succeeded", o)
		}
	}
	for in, want := range map[string]kvevents.Layout{"array": kvevents.LayoutArray, "MAP": kvevents.LayoutMap, "": kvevents.LayoutArray} {
		if got, err := vllmsim.ParseKVFormat(in); err != nil || got != want {
			t.Errorf("ParseKVFormat(%q) = %+v, %v", in, got, err)
		}
	}
	if _, err := vllmsim.ParseKVFormat("json"); err == nil {
		t.Error("ParseKVFormat(json) succeeded")
	}
	// The same endpoint cannot be bound twice.
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{})
	if p2, err := vllmsim.NewKVPublisher(vllmsim.KVPublisherOptions{Endpoint: p.Endpoint()}); err == nil {
		_ = p2.Close()
		t.Error("second bind succeeded")
	}
}

// TestKVPublisherSlowSubscriber checks the per-subscriber high-water mark:
// a subscriber that stops reading misses messages (counted) while the cache
// and the other subscribers go on, and Close does not hang on it.
func TestKVPublisherSlowSubscriber(t *testing.T) {
	p := newKVPublisher(t, vllmsim.KVPublisherOptions{HWM: 4})
	// A SUB that subscribes and then never reads: a raw ZMTP connection.
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	zc, err := zmq4.Open(conn, null.Security(), zmq4.Sub, zmq4.SocketIdentity("stuck"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := zc.SendMsg(zmq4.NewMsg([]byte{1})); err != nil { // subscribe to everything
		t.Fatal(err)
	}
	waitFor(t, "stuck subscription", func() bool { return p.Stats().Subscribers == 1 })
	sub := newSub(t, p, p.Endpoint(), "")

	c := vllmsim.NewCache(16, 1<<20, p)
	const ops = 60
	var inCache time.Duration
	for i := range ops {
		start := time.Now()
		c.Admit(seqTokens(uint32(i)<<20, 16*4096)) // 4096 blocks: a ~300 kB batch
		inCache += time.Since(start)
		// The reading subscriber keeps up (it gets every message), the
		// stuck one falls behind.
		if msgs, _ := recvMsgs(t, sub, 1); msgs[0].Seq != uint64(i) {
			t.Fatalf("reading subscriber: message %d has seq %d", i, msgs[0].Seq)
		}
	}
	if inCache > 5*time.Second {
		t.Errorf("cache operations took %v: the publisher slowed the cache", inCache)
	}
	waitFor(t, "drops for the stuck subscriber", func() bool { return p.Stats().SubscriberDrops > 0 })
	start := time.Now()
	_ = p.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v with a stuck subscriber", d)
	}
}
