package proxy

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestEchoedName: an error quotes a short model name whole and a long one
// cut at maxEchoedName bytes, on a rune boundary, with "…" after it.
func TestEchoedName(t *testing.T) {
	if got := echoedName("llama-3.1-8b"); got != "llama-3.1-8b" {
		t.Errorf("short name %q", got)
	}
	long := strings.Repeat("m", 1<<20)
	if got := echoedName(long); got != long[:maxEchoedName]+"…" {
		t.Errorf("long name cut to %d bytes", len(got))
	}
	// "é" is two bytes: one at byte maxEchoedName-1 would straddle the cut.
	wide := strings.Repeat("a", maxEchoedName-1) + strings.Repeat("é", 10)
	got := echoedName(wide)
	if !utf8.ValidString(got) || got != wide[:maxEchoedName-1]+"…" {
		t.Errorf("cut inside a rune: %q", got[len(got)-8:])
	}
}
