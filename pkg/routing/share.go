package routing

import "rolter.dev/pkg/chunkindex"

// SharedAffinity is implemented by balancers built with [Spec.Share]
// (cache_aware, and pipeline with its prefix_cache scorer): other proxies'
// observations fold into their prefix matching, so several proxies behind an
// L4 balancer match against what the whole fleet sent to each target.
type SharedAffinity interface {
	// RecordLocal adds a prompt this proxy sent to target (as handed to
	// Spec.Share) to the shared index and appends to dst the hashes the
	// fleet should hear about (see rolter.dev/pkg/chunkindex). The fleet
	// calls it from its flush, off the request path.
	RecordLocal(target int, prompt string, dst []uint64) []uint64
	// FoldPeer records that a peer sent target prompts whose fingerprints
	// include chunks (rolter.dev/pkg/chunkindex hashes).
	FoldPeer(target int, chunks []uint64)
	// ExportShared appends target's shared hashes to dst, oldest first: at
	// most limit (the newest), or all when limit <= 0. It is what a new
	// peer warms up from.
	ExportShared(target int, dst []uint64, limit int) []uint64
	// SharedStats returns one entry per target: the hashes held and evicted.
	SharedStats() []chunkindex.Stats
}

// sharing is the shared prefix index of one balancer; nil when the route
// does not share.
type sharing struct {
	index   *chunkindex.Index
	publish func(target int, prompt string)
}

// newSharing returns nil when publish is nil. The index holds at most
// maxNodes bytes' worth of chunks per target, the tree's own ceiling.
func newSharing(n, maxNodes int, publish func(int, string)) *sharing {
	if publish == nil {
		return nil
	}
	return &sharing{index: chunkindex.New(n, max(maxNodes/chunkindex.ChunkBytes, 1)), publish: publish}
}

// widen raises match[i] to what the shared index holds for the prompt,
// unless an eligible target already holds all of it (then no peer can do
// better, and the lookup is skipped).
func (s *sharing) widen(prompt string, match []int, el Set) {
	if s == nil {
		return
	}
	for wi, w := range el.w {
		for ; w != 0; w &= w - 1 {
			if i := wi*64 + bitIndex(w); i < len(match) && match[i] == len(prompt) {
				return
			}
		}
	}
	var buf [MaxTargets]int
	shared := buf[:len(match)]
	s.index.Match(prompt, shared)
	for i, m := range shared {
		match[i] = max(match[i], m)
	}
}

// observe hands a local pick to the fleet; the index work waits for its
// flush (RecordLocal).
func (s *sharing) observe(target int, prompt string) {
	if s != nil {
		s.publish(target, prompt)
	}
}

func (s *sharing) RecordLocal(target int, prompt string, dst []uint64) []uint64 {
	if s == nil {
		return dst
	}
	return s.index.Observe(target, prompt, dst)
}

func (s *sharing) FoldPeer(target int, chunks []uint64) {
	if s != nil {
		s.index.Fold(target, chunks)
	}
}

func (s *sharing) ExportShared(target int, dst []uint64, limit int) []uint64 {
	if s == nil {
		return dst
	}
	return s.index.Export(target, dst, limit)
}

func (s *sharing) SharedStats() []chunkindex.Stats {
	if s == nil {
		return nil
	}
	out := make([]chunkindex.Stats, s.index.Targets())
	for i := range out {
		out[i] = s.index.Stats(i)
	}
	return out
}
