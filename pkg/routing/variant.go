package routing

import (
	"math"

	"github.com/zeebo/xxh3"
)

// RankVariants orders a route's variants for one request by weighted
// rendezvous hashing (Schindelhauer and Schomaker's weighted
// highest-random-weight): each variant v scores w_v / -ln(h(key, name_v))
// with h uniform in (0, 1), and the highest score is the assignment. The
// first variant is therefore chosen with probability w_v / Σw, the same key
// always gets the same ranking, and a variant's score depends only on its
// own name and weight: moving weight between two variants moves only the
// keys that change between those two (moving 5 % of the weight moves about
// 5 % of the keys), and the keys of the other variants stay where they are.
//
// The rest of the ranking is the order a request falls over in when its
// assigned variant has nothing eligible. Variants of weight 0 (drained)
// are left out. The indexes are appended to out[:0] and returned.
func RankVariants(out []int, key string, names []string, weights []int) []int {
	out = out[:0]
	if len(names) == 0 {
		return out
	}
	type scored struct {
		i     int
		score float64
	}
	var buf [16]scored
	s := buf[:0]
	for i, name := range names {
		if i >= len(weights) || weights[i] <= 0 {
			continue
		}
		s = append(s, scored{i, float64(weights[i]) / -math.Log(unitHash(key, name))})
	}
	// Insertion sort: a route has a handful of variants, and it allocates
	// nothing.
	for a := 1; a < len(s); a++ {
		for b := a; b > 0 && s[b].score > s[b-1].score; b-- {
			s[b], s[b-1] = s[b-1], s[b]
		}
	}
	for _, e := range s {
		out = append(out, e.i)
	}
	return out
}

// unitHash maps (key, name) to a uniform value in the open interval (0, 1).
func unitHash(key, name string) float64 {
	h := xxh3.HashStringSeed(name, xxh3.HashString(key))
	return (float64(h>>11) + 0.5) / (1 << 53)
}

// AssignmentKey is the key a request's variant ranking is sticky on: its
// session (x-session-id) when it has one, else its virtual key's id, else
// its own request id (a new assignment per request). The kinds are kept
// apart, so a session named like a key does not share its assignment.
func AssignmentKey(session, keyID, requestID string) string {
	switch {
	case session != "":
		return "session\x1f" + session
	case keyID != "":
		return "key\x1f" + keyID
	}
	return "request\x1f" + requestID
}
