package routing

import (
	"fmt"
	"testing"
)

func TestSessionTableCap(t *testing.T) {
	st := newSessionTable(nil)
	for i := range SessionCap + 5000 {
		st.record(fmt.Sprintf("session-%d", i), i%7)
	}
	total := 0
	for i := range st.shards {
		total += len(st.shards[i].m)
	}
	if total > SessionCap {
		t.Fatalf("%d sessions remembered, cap %d", total, SessionCap)
	}
	if tg, ok := st.lookup(fmt.Sprintf("session-%d", SessionCap+4999)); !ok || tg != (SessionCap+4999)%7 {
		t.Fatalf("newest session: %d, %v", tg, ok)
	}
	// Updating a known session at the cap forgets nothing.
	st.record(fmt.Sprintf("session-%d", SessionCap+4999), 3)
	after := 0
	for i := range st.shards {
		after += len(st.shards[i].m)
	}
	if after != total {
		t.Fatalf("update changed the size %d -> %d", total, after)
	}
}
