package sim

import (
	"time"

	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/tests/vllmsim"
)

// The simulated KV-event path of precise routing. Every replica's cache
// reports its changes (vllmsim's Listener); a per-replica watcher turns them
// into kvdelta ops at once, as rolter-kvwatcher does; the ops reach every
// proxy's index Config.KVEventDelay later (the engine's publish interval
// plus the watcher → NATS → proxy hop, in one number). A rolter proxy keeps
// one pkg/kvindex.Residency per replica, the state pkg/kvindex.Index keeps
// per provider, on the virtual clock; identities come from pkg/kvindex's
// functions (Seed, Chain, AppendIdentities), so a request's identities match
// the events' exactly as in the data plane. The peers' indexes (llm-d's,
// whose speculation differs, and Dynamo's) are eventIndex below.

// kvModel is the model name identities are seeded with: the model of the
// simulated chat bodies (Request.ChatBody).
const kvModel = "sim"

// kvSeed is kvindex.Seed(kvModel), the parent of every chain's first block.
var kvSeed = kvindex.Seed(kvModel)

// kvBatch is one cache operation's ops on one replica, in flight to the
// proxies. Its slices are shared read-only by every proxy.
type kvBatch struct {
	replica int
	ops     []kvdelta.Op
}

// kvConsumer is a policy fed by the replicas' KV events: Run installs the
// event path when any proxy's policy implements it, and calls applyKV on
// every such policy, each proxy's own index receiving the same batches at
// the same virtual time.
type kvConsumer interface {
	applyKV(replica int, ops []kvdelta.Op)
}

// kvWatcher maps one replica's engine block hashes to identities, as
// kvwatcher/internal/kvstate does: a BlockStored run chains from its parent
// block's identity (or from the seed when it starts a prompt), each block's
// identity is kvindex.Chain of its parent's and its tokens; BlockRemoved
// looks the hashes up. A run whose parent is unknown is skipped (kvstate's
// SkippedParent), which cannot happen with a cache that reports every
// change.
type kvWatcher struct {
	ids map[uint64]uint64 // engine hash → identity
}

func newKVWatcher() *kvWatcher { return &kvWatcher{ids: map[uint64]uint64{}} }

// translate converts one listener batch into identity ops.
func (w *kvWatcher) translate(batch []vllmsim.KVEvent) []kvdelta.Op {
	ops := make([]kvdelta.Op, 0, len(batch))
	for i := range batch {
		ev := &batch[i]
		switch ev.Kind {
		case vllmsim.BlockStored:
			parent := kvSeed
			if ev.HasParent {
				p, ok := w.ids[ev.ParentBlockHash]
				if !ok {
					continue
				}
				parent = p
			}
			bs := ev.BlockSize
			if bs < 1 {
				continue
			}
			n := min(len(ev.BlockHashes), len(ev.TokenIDs)/bs)
			ids := make([]uint64, 0, n)
			for j := range n {
				parent = kvindex.Chain(parent, ev.TokenIDs[j*bs:(j+1)*bs])
				w.ids[ev.BlockHashes[j]] = parent
				ids = append(ids, parent)
			}
			ops = append(ops, kvdelta.Op{Kind: kvdelta.OpStored, IDs: ids})
		case vllmsim.BlockRemoved:
			ids := make([]uint64, 0, len(ev.BlockHashes))
			for _, h := range ev.BlockHashes {
				if id, ok := w.ids[h]; ok {
					delete(w.ids, h)
					ids = append(ids, id)
				}
			}
			ops = append(ops, kvdelta.Op{Kind: kvdelta.OpRemoved, IDs: ids})
		case vllmsim.AllBlocksCleared:
			clear(w.ids)
			ops = append(ops, kvdelta.Op{Kind: kvdelta.OpCleared})
		}
	}
	return ops
}

// llmdSweepEvery is how often llm-d's speculation drops expired entries in
// the model (pkg/kvindex's rate, for a like-for-like comparison).
const llmdSweepEvery = time.Second

// eventIndex is one peer router's view of the replicas' resident
// identities from their KV events (Dynamo's indexer, llm-d's kvblock.Index)
// plus, for llm-d, its speculative entries, on the virtual clock. Unlike
// rolter's (pkg/kvindex.Residency: speculation only for identities not yet
// resident, dropped by any event for the identity), llm-d's speculative
// PodEntry lives beside the confirmed one in kvblock.Index: it is added for
// every identity and only its TTL removes it.
type eventIndex struct {
	reps []eventResident
}

type eventResident struct {
	resident  map[uint64]struct{}
	spec      map[uint64]time.Duration // identity → expiry
	lastSweep time.Duration
}

func newEventIndex(replicas int) *eventIndex {
	x := &eventIndex{reps: make([]eventResident, replicas)}
	for i := range x.reps {
		x.reps[i] = eventResident{resident: map[uint64]struct{}{}, spec: map[uint64]time.Duration{}}
	}
	return x
}

// apply applies one replica's ops in order; speculation is untouched.
func (x *eventIndex) apply(replica int, ops []kvdelta.Op) {
	p := &x.reps[replica]
	for _, op := range ops {
		switch op.Kind {
		case kvdelta.OpStored:
			for _, id := range op.IDs {
				p.resident[id] = struct{}{}
			}
		case kvdelta.OpRemoved:
			for _, id := range op.IDs {
				delete(p.resident, id)
			}
		case kvdelta.OpCleared:
			clear(p.resident)
		}
	}
}

// prefixMatch returns how many of ids, from the first, the replica holds or
// was speculatively given until after now.
func (x *eventIndex) prefixMatch(replica int, ids []uint64, now time.Duration) int {
	p := &x.reps[replica]
	for i, id := range ids {
		if _, ok := p.resident[id]; ok {
			continue
		}
		if exp, ok := p.spec[id]; ok && exp > now {
			continue
		}
		return i
	}
	return len(ids)
}

// speculate marks ids as held by the replica until now+ttl, sweeping
// expired entries at most once a second.
func (x *eventIndex) speculate(replica int, ids []uint64, now, ttl time.Duration) {
	if len(ids) == 0 || ttl <= 0 {
		return
	}
	p := &x.reps[replica]
	for _, id := range ids {
		p.spec[id] = now + ttl
	}
	if now-p.lastSweep > llmdSweepEvery {
		p.lastSweep = now
		for id, e := range p.spec {
			if e <= now {
				delete(p.spec, id)
			}
		}
	}
}

// identities is a one-entry memo of kvindex.AppendIdentities: a pick scores
// and then speculates the same token ids. It keys on the slice's address, so
// the policy must forget it at the start of every pick (a released slice's
// memory may come back as another request's tokens).
type identities struct {
	bs     int
	ids    []uint64
	of     *uint32
	n      int
	filled bool
}

func (m *identities) get(tokenIDs []uint32) []uint64 {
	if len(tokenIDs) == 0 {
		return nil
	}
	if m.filled && m.of == &tokenIDs[0] && m.n == len(tokenIDs) {
		return m.ids
	}
	m.ids = kvindex.AppendIdentities(m.ids[:0], kvSeed, tokenIDs, m.bs)
	m.of, m.n, m.filled = &tokenIDs[0], len(tokenIDs), true
	return m.ids
}

// forget drops the memo (its token ids are about to be released).
func (m *identities) forget() { m.of, m.filled = nil, false }
