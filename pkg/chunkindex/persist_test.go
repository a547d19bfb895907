package chunkindex_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"rolter.dev/pkg/chunkindex"
	"rolter.dev/pkg/wire"
)

// persisted builds a small index with every feature on (forks, stamps,
// tail-first eviction, a target at its own capacity) and the prompts it
// observed.
func persisted(now *int64) (*chunkindex.Index, []string) {
	rng := rand.New(rand.NewPCG(31, 32))
	cb := chunkindex.ChunkBytes
	x := chunkindex.New(3, 8)
	x.TrackForks()
	x.EvictTailFirst()
	x.SetClock(func() int64 { return *now })
	system := text(rng, 2*cb)
	prompts := []string{system + text(rng, cb), system + text(rng, 2*cb), text(rng, 3*cb), text(rng, 5*cb)}
	for i, p := range prompts {
		*now = int64(100 * (i + 1))
		x.Observe(i%3, p, nil)
	}
	x.SetCapacity(2, 3) // prompt 2's three chunks fill target 2
	return x, prompts
}

// An index written and read back (a proxy's restart) holds what each
// target held, in the same LRU order, with the same capacities, counters,
// forks and ages (the time between the write and the read not counted),
// and goes on exactly as the original would.
func TestBinaryKeepsWhatEachTargetHolds(t *testing.T) {
	now := int64(0)
	x, prompts := persisted(&now)
	now = 1000
	data, err := x.AppendBinary([]byte("prefix"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("prefix")) {
		t.Fatal("AppendBinary did not append")
	}
	later := int64(5_000_000) // the restarted proxy's clock
	y, err := chunkindex.Decode(data[len("prefix"):], func() int64 { return later })
	if err != nil {
		t.Fatal(err)
	}
	if y.Targets() != x.Targets() || y.Capacity() != x.Capacity() {
		t.Fatalf("decoded %d targets of capacity %d, want %d of %d", y.Targets(), y.Capacity(), x.Targets(), x.Capacity())
	}
	for i := range x.Targets() {
		if got, want := y.Export(i, nil, 0), x.Export(i, nil, 0); !slices.Equal(got, want) || len(want) == 0 {
			t.Errorf("target %d exports %v, want %v (same hashes, same order, not empty)", i, got, want)
		}
		if y.Stats(i) != x.Stats(i) || y.TargetCapacity(i) != x.TargetCapacity(i) {
			t.Errorf("target %d: stats %+v capacity %d, want %+v %d", i, y.Stats(i), y.TargetCapacity(i), x.Stats(i), x.TargetCapacity(i))
		}
		xa, xfull := x.Tail(i)
		ya, yfull := y.Tail(i)
		if xfull != yfull || (xfull && later-ya != now-xa) || (i == 2 && !xfull) {
			t.Errorf("target %d: tail %d (full %v) on the new clock, want the same age as %d (full %v) at %d", i, ya, yfull, xa, xfull, now)
		}
	}
	if got, want := y.SharedLen(prompts[0]+"more"), x.SharedLen(prompts[0]+"more"); got != want || want == 0 {
		t.Errorf("shared length %d after the read, want %d (the system prompt)", got, want)
	}
	xl, yl := make([]int, 3), make([]int, 3)
	for _, p := range prompts {
		x.Match(p, xl)
		y.Match(p, yl)
		if !slices.Equal(xl, yl) {
			t.Errorf("matches %v after the read, want %v", yl, xl)
		}
	}
	// Both go on alike: the same hashes to publish, the same evictions.
	rng := rand.New(rand.NewPCG(33, 34))
	for k := range 6 {
		p := prompts[k%len(prompts)] + text(rng, 70)
		if got, want := y.Observe(k%3, p, nil), x.Observe(k%3, p, nil); !slices.Equal(got, want) {
			t.Fatalf("observe %d publishes %v after the read, want %v", k, got, want)
		}
	}
	for i := range x.Targets() {
		if got, want := y.Export(i, nil, 0), x.Export(i, nil, 0); !slices.Equal(got, want) {
			t.Errorf("target %d after more traffic exports %v, want %v", i, got, want)
		}
	}
}

// Without a clock the decoded index has no stamps; an unstamped index
// reads back unstamped.
func TestBinaryWithoutClock(t *testing.T) {
	now := int64(0)
	x, prompts := persisted(&now)
	data, _ := x.AppendBinary(nil)
	y, err := chunkindex.Decode(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if at, full := y.Tail(2); !full || at != 0 {
		t.Errorf("tail %d (full %v) without a clock, want 0 and full", at, full)
	}
	plain := chunkindex.New(2, 0)
	plain.Observe(1, prompts[3], nil)
	data, _ = plain.AppendBinary(nil)
	z, err := chunkindex.Decode(data, func() int64 { return 7 })
	if err != nil {
		t.Fatal(err)
	}
	if got := z.Export(1, nil, 0); !slices.Equal(got, plain.Export(1, nil, 0)) {
		t.Errorf("unstamped index reads back %v", got)
	}
}

// Every damaged form is refused with wire.ErrCorrupt: each truncation,
// trailing bytes, another magic, a hash twice, a target over its capacity.
func TestDecodeRefusesDamage(t *testing.T) {
	now := int64(0)
	x, _ := persisted(&now)
	data, _ := x.AppendBinary(nil)
	for n := range len(data) {
		if _, err := chunkindex.Decode(data[:n], nil); !errors.Is(err, wire.ErrCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: err %v, want ErrCorrupt", n, len(data), err)
		}
	}
	if _, err := chunkindex.Decode(append(slices.Clone(data), 0), nil); !errors.Is(err, wire.ErrCorrupt) {
		t.Errorf("a trailing byte: err %v", err)
	}
	bad := slices.Clone(data)
	bad[3] = 2
	if _, err := chunkindex.Decode(bad, nil); !errors.Is(err, wire.ErrCorrupt) {
		t.Errorf("version 2: err %v", err)
	}
	// One target, no forks, no stamps: a hash twice, then over capacity.
	form := func(capacity uint64, hashes ...uint64) []byte {
		b := []byte("rci\x01")
		b = binary.AppendUvarint(b, 0) // default capacity
		b = binary.AppendUvarint(b, 0) // flags
		b = binary.AppendUvarint(b, 1) // targets
		b = binary.AppendUvarint(b, capacity)
		b = binary.AppendUvarint(b, uint64(len(hashes))) // inserts
		b = binary.AppendUvarint(b, 0)                   // evictions
		b = binary.AppendUvarint(b, uint64(len(hashes)))
		for _, h := range hashes {
			b = binary.LittleEndian.AppendUint64(b, h)
			b = binary.AppendUvarint(b, 0)
		}
		return b
	}
	if _, err := chunkindex.Decode(form(0, 1, 2), nil); err != nil {
		t.Fatalf("the hand-written form is refused: %v", err)
	}
	if _, err := chunkindex.Decode(form(0, 1, 2, 1), nil); !errors.Is(err, wire.ErrCorrupt) {
		t.Errorf("a hash twice: err %v", err)
	}
	if _, err := chunkindex.Decode(form(2, 1, 2, 3), nil); !errors.Is(err, wire.ErrCorrupt) {
		t.Errorf("three hashes at capacity 2: err %v", err)
	}
}

// FuzzDecode: any input either is refused or reads back an index whose
// own binary form is a fixed point (write, read, write gives the same
// bytes).
func FuzzDecode(f *testing.F) {
	now := int64(0)
	x, _ := persisted(&now)
	data, _ := x.AppendBinary(nil)
	f.Add(data)
	plain := chunkindex.New(2, 3)
	plain.Observe(0, "a prompt longer than one chunk of sixty-four bytes, so it has two hashes", nil)
	data, _ = plain.AppendBinary(nil)
	f.Add(data)
	f.Add([]byte("rci\x01"))
	clock := func() int64 { return 1 << 40 }
	f.Fuzz(func(t *testing.T, data []byte) {
		y, err := chunkindex.Decode(data, clock)
		if err != nil {
			if !errors.Is(err, wire.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		once, _ := y.AppendBinary(nil)
		z, err := chunkindex.Decode(once, clock)
		if err != nil {
			t.Fatalf("an index's own form is refused: %v", err)
		}
		twice, _ := z.AppendBinary(nil)
		if !bytes.Equal(once, twice) {
			t.Fatalf("written, read and written again differs:\n%x\n%x", once, twice)
		}
	})
}
