package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"
)

// TraceBlockTokens is the number of tokens per hash id in a Mooncake trace
// (FAST'25); other traces of the same format hash smaller blocks (see
// TraceWorkload's blockTokens).
const TraceBlockTokens = 512

// TraceRecord is one request of a Mooncake-format trace (FAST'25,
// kvcache-ai/Mooncake FAST25-release/traces).
type TraceRecord struct {
	// Timestamp is the arrival in milliseconds since the trace start.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are token counts.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs has one id per block of the prompt (512 tokens in Mooncake's
	// traces); equal ids mean equal content (and ids chain like a prefix).
	HashIDs []int64 `json:"hash_ids"`
}

// ReadTrace parses a Mooncake JSONL trace. Blank lines are skipped; any
// other line that does not parse, or a record with no blocks, a negative
// length or a timestamp before its predecessor's, is an error naming the
// line. limit > 0 stops after that many records.
func ReadTrace(r io.Reader, limit int) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var out []TraceRecord
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		switch {
		case len(rec.HashIDs) == 0:
			return nil, fmt.Errorf("trace line %d: no hash_ids", line)
		case rec.InputLength <= 0 || rec.OutputLength < 0:
			return nil, fmt.Errorf("trace line %d: input_length %d, output_length %d", line, rec.InputLength, rec.OutputLength)
		case len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp:
			return nil, fmt.Errorf("trace line %d: timestamp %d before the previous %d", line, rec.Timestamp, out[len(out)-1].Timestamp)
		}
		out = append(out, rec)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace line %d: %w", line+1, err)
	}
	return out, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// ReadTraceFile reads a trace file (see ReadTrace).
func ReadTraceFile(path string, limit int) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f, limit)
}

// TraceBlockHitRate is the trace's prefix hit rate over blocks with one
// unbounded cache: for every request, the leading hash ids that an earlier
// request already had, over all hash ids (36.64 % for the Mooncake
// conversation trace).
func TraceBlockHitRate(recs []TraceRecord) float64 {
	seen := make(map[int64]struct{})
	var hit, total int
	for _, r := range recs {
		k := 0
		for k < len(r.HashIDs) {
			if _, ok := seen[r.HashIDs[k]]; !ok {
				break
			}
			k++
		}
		hit += k
		total += len(r.HashIDs)
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// TraceWorkload replays trace records open loop at their timestamps divided
// by speedup (≤ 0 means 1). Each record is one single-turn session whose
// prompt is one user message: for each hash id, that block's blockTokens
// words (≤ 0 means TraceBlockTokens; fewer in the last block, so that the
// prompt has input_length content tokens, or more where input_length is
// longer than its blocks), the words derived from the id alone, so equal ids
// give equal text and text-based routers see the trace's sharing structure.
func TraceWorkload(recs []TraceRecord, blockTokens int, speedup float64, seed uint64) *Workload {
	if speedup <= 0 {
		speedup = 1
	}
	if blockTokens <= 0 {
		blockTokens = TraceBlockTokens
	}
	w := &Workload{Name: "trace"}
	for i, r := range recs {
		segs := make([]Segment, 0, len(r.HashIDs))
		left := r.InputLength
		for j, id := range r.HashIDs {
			n := min(left, blockTokens)
			if j == len(r.HashIDs)-1 {
				n = left // a record longer than its blocks keeps its length
			}
			if n <= 0 {
				break
			}
			segs = append(segs, Segment{Key(seed, kindTraceBlock, uint64(id)), n})
			left -= n
		}
		start := time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / speedup)
		w.Sessions = append(w.Sessions, &Session{
			ID: i, Key: sessionKey("trace", i), Start: start,
			Turns: []Turn{{
				Messages: []Message{{Role: "user", Content: segs}},
				Output:   max(r.OutputLength, 1),
			}},
		})
	}
	return w
}

// SpreadArrivals spreads sessions that start at the same instant evenly at
// random over the time until the next distinct start (or, for the last
// group, over the mean gap), keeping their order. The Mooncake trace's
// timestamps are bucketed in ~3 s steps, about 10 requests to a bucket: as
// recorded they arrive in the same nanosecond, a burst that one proxy serves
// in turn but that several proxies behind an L4 spread see at once, with no
// time to hear of one another. Spreading them is what the traffic looked
// like before bucketing.
func SpreadArrivals(w *Workload, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x737072656164)) // "spread"
	ss := w.Sessions
	var mean time.Duration
	if n := len(ss); n > 1 && ss[n-1].Start > ss[0].Start {
		mean = (ss[n-1].Start - ss[0].Start) / time.Duration(n-1)
	}
	for i := 0; i < len(ss); {
		j := i
		for j < len(ss) && ss[j].Start == ss[i].Start {
			j++
		}
		gap := mean * time.Duration(j-i)
		if j < len(ss) {
			gap = ss[j].Start - ss[i].Start
		}
		if ss[i].Start >= 0 && j-i > 1 && gap > 0 {
			offs := make([]time.Duration, j-i)
			for k := range offs {
				offs[k] = time.Duration(rng.Int64N(int64(gap)))
			}
			slices.Sort(offs)
			for k := range offs {
				ss[i+k].Start += offs[k]
			}
		}
		i = j
	}
}
