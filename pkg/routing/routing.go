package routing

import (
	"math/bits"
	"strconv"
	"strings"

	"rolter.dev/pkg/chunkindex"
)

// Context is what a balancer knows about a request. The dataplane builds it
// once per request; balancers must not retain it past Pick or Observe.
type Context struct {
	// Prompt is the leading part (at most 32 KiB, cut on a character boundary)
	// of the conversation text in the order the model sees it, or the raw body
	// when no prompt shape could be read. Empty when unknown.
	Prompt string
	// PromptLen is the byte length of the whole prompt including tool
	// traffic; 0 means Prompt is the whole prompt (or nothing is known).
	PromptLen int
	// PromptDigest is the xxh3-64 digest of the whole prompt, including tool
	// traffic and media; valid only when HasDigest is set.
	PromptDigest uint64
	// HasDigest reports whether PromptDigest is set.
	HasDigest bool
	// PromptChain is the chunk fingerprint (rolter.dev/pkg/chunkindex) of
	// the whole conversation text when Prompt was cut, else zero.
	// predicted_ttft's approximate index matches and records it, so a
	// prefix shared past the cut still counts.
	PromptChain chunkindex.Chain
	// SessionKey comes from the x-session-id header.
	SessionKey string
	// TokenIDs come from the x-rolter-vllm-token-ids header; nil when absent
	// or unparsable.
	TokenIDs []uint32
	// Buffered marks a request whose answer comes back whole (its client
	// does not stream): the proxy sees no first token, only the complete
	// answer (predicted_ttft: TTFTObserver.WholeAnswer).
	Buffered bool
	// ReadsNoCache marks a request the engine prefills whole whatever its
	// prefix cache holds (vLLM's skip_reading_prefix_cache, which prompt
	// log probabilities set), though it caches the blocks it computes:
	// predicted_ttft prices it as a prompt no target holds. The seed's
	// strategies ignore it.
	ReadsNoCache bool
}

// Balancer picks a target for one attempt of a request.
type Balancer interface {
	// Name is the strategy name as written in config.
	Name() string
	// Pick returns the index of the chosen target in [0, n), or -1 when there
	// is nothing to pick. loads has one in-flight count per target, or is nil
	// when loads are unknown (a slice whose length is not n counts as
	// unknown). A target outside eligible is never returned unless eligible
	// has no member below n, in which case every target is weighed.
	Pick(ctx *Context, loads []int, eligible Set) int
	// Observe records that target was chosen for ctx. It is called after the
	// pick and before the upstream call, on every attempt.
	Observe(target int, ctx *Context)
}

// Inheritor is implemented by balancers that can take over what another
// balancer of the same strategy and parameters learned when a route's
// targets change (a replica added or removed, the fleet scaled): from[j]
// is the index in old's targets of this balancer's target j, or -1 for a
// target old did not have. Inherit is called once, on a balancer no pick
// has used yet; old keeps serving the attempts it observed and is only
// read. It reports whether it took anything (false when old is not of its
// kind).
type Inheritor interface {
	Inherit(old Balancer, from []int) bool
}

// StateKeeper is implemented by balancers whose learned state outlives
// their process: the proxy writes it to disk (rolter-proxy
// --routing-state) and hands it to the balancer built after a restart.
// AppendState appends the state in a versioned binary form to dst; it is
// safe while the balancer serves. RestoreState takes what a balancer of
// the same strategy and parameters wrote, from[j] being the index in the
// saved balancer's targets of this one's target j, or -1, as for
// Inheritor; it is called once, before any pick. On an error (wrapping
// wire.ErrCorrupt for input it cannot read) it changes nothing.
type StateKeeper interface {
	AppendState(dst []byte) ([]byte, error)
	RestoreState(state []byte, from []int) error
}

// MaxTargets is the largest number of targets a route may have. It keeps a
// Set in one machine word per 64 targets without allocating on the hot path.
const MaxTargets = 256

// Set is a set of target indexes in [0, MaxTargets). The zero value is empty.
// It is a value type: copying it copies the set, so it needs no locking.
type Set struct {
	w [MaxTargets / 64]uint64
}

// All returns the set {0, ..., n-1} (n is clamped to [0, MaxTargets]).
func All(n int) Set {
	var s Set
	for wi := range s.w {
		s.w[wi] = lowMask(n - wi*64)
	}
	return s
}

// lowMask returns a word with the lowest k bits set, k clamped to [0, 64].
func lowMask(k int) uint64 {
	switch {
	case k <= 0:
		return 0
	case k >= 64:
		return ^uint64(0)
	default:
		return 1<<uint(k) - 1
	}
}

// Add puts i in the set; indexes outside [0, MaxTargets) are ignored.
func (s *Set) Add(i int) {
	if i >= 0 && i < MaxTargets {
		s.w[i>>6] |= 1 << (uint(i) & 63)
	}
}

// Remove takes i out of the set.
func (s *Set) Remove(i int) {
	if i >= 0 && i < MaxTargets {
		s.w[i>>6] &^= 1 << (uint(i) & 63)
	}
}

// Has reports whether i is in the set.
func (s Set) Has(i int) bool {
	return i >= 0 && i < MaxTargets && s.w[i>>6]&(1<<(uint(i)&63)) != 0
}

// Len is the number of members.
func (s Set) Len() int {
	n := 0
	for _, w := range s.w {
		n += bits.OnesCount64(w)
	}
	return n
}

// Empty reports whether the set has no members.
func (s Set) Empty() bool { return s.w == [MaxTargets / 64]uint64{} }

// Below returns the members of s that are below n.
func (s Set) Below(n int) Set {
	for wi := range s.w {
		s.w[wi] &= lowMask(n - wi*64)
	}
	return s
}

// OrAll returns the members of s below n, or All(n) when s has no member below
// n: "when nothing is eligible, weigh every target". The result never holds a
// member at or above n.
func (s Set) OrAll(n int) Set {
	b := s.Below(n)
	if b.Empty() {
		return All(n)
	}
	return b
}

// Nth returns the k-th member (0-based, in index order) below n, or -1 when
// k < 0 or there are at most k such members. It costs a few word operations,
// not a scan of every index.
func (s Set) Nth(k, n int) int {
	if k < 0 {
		return -1
	}
	b := s.Below(n)
	for wi, w := range b.w {
		c := bits.OnesCount64(w)
		if k < c {
			return wi*64 + selectBit(w, k)
		}
		k -= c
	}
	return -1
}

// selectBit returns the position of the k-th (0-based) set bit of w; w must
// have more than k bits set.
func selectBit(w uint64, k int) int {
	pos := 0
	for width := 32; width > 0; width >>= 1 {
		if low := bits.OnesCount64(w & (1<<uint(width) - 1)); k >= low {
			k -= low
			w >>= uint(width)
			pos += width
		}
	}
	return pos
}

// String renders the set as {0,2,5} for test failures and logs.
func (s Set) String() string {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for wi, w := range s.w {
		for ; w != 0; w &= w - 1 {
			if !first {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(wi*64 + bits.TrailingZeros64(w)))
			first = false
		}
	}
	b.WriteByte('}')
	return b.String()
}

// bitIndex is the index of the lowest set bit of w; strategies walk a Set's
// members with `for ; w != 0; w &= w - 1 { i := wi*64 + bitIndex(w) }`.
func bitIndex(w uint64) int { return bits.TrailingZeros64(w) }

// without returns the members of s that are not in o.
func (s Set) without(o Set) Set {
	for wi := range s.w {
		s.w[wi] &^= o.w[wi]
	}
	return s
}
