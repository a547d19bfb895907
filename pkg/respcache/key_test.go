package respcache_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"regexp"
	"testing"

	"rolter.dev/pkg/respcache"
	"rolter.dev/pkg/respcache/canon"
)

func TestExactKey(t *testing.T) {
	// The layout, spelled out: namespace ":" hex(sha256(path 0x1f scope 0x1f canonical)).
	sum := sha256.Sum256([]byte("/v1/chat/completions\x1fkey-a\x1f" + `{"a":[1,{"b":"é"}],"z":null}`))
	want := "ns:" + hex.EncodeToString(sum[:])
	tests := []struct {
		name, body string
	}{
		{"canonical already", `{"a":[1,{"b":"é"}],"z":null}`},
		{"keys reordered", `{"z":null,"a":[1,{"b":"é"}]}`},
		{"whitespace and escapes", "{ \"z\" : null ,\n \"a\" : [ 1 , { \"b\" : \"\\u00e9\" } ] }"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := respcache.ExactKey("ns", "/v1/chat/completions", "key-a", []byte(tc.body))
			if err != nil || got != want {
				t.Fatalf("ExactKey = %q, %v; want %q", got, err, want)
			}
		})
	}
	other := map[string][3]string{
		"another path":               {"/v1/completions", "key-a", `{"a":[1,{"b":"é"}],"z":null}`},
		"another scope":              {"/v1/chat/completions", "", `{"a":[1,{"b":"é"}],"z":null}`},
		"another value":              {"/v1/chat/completions", "key-a", `{"a":[1,{"b":"e"}],"z":null}`},
		"number spelled differently": {"/v1/chat/completions", "key-a", `{"a":[1.0,{"b":"é"}],"z":null}`},
	}
	for name, in := range other {
		if got, _ := respcache.ExactKey("ns", in[0], in[1], []byte(in[2])); got == want {
			t.Errorf("%s: same key", name)
		}
	}
	if _, err := respcache.ExactKey("ns", "/p", "", []byte(`{"a":`)); !errors.Is(err, canon.ErrSyntax) {
		t.Fatalf("ExactKey of invalid JSON: %v", err)
	}
}

func TestIndexKey(t *testing.T) {
	var part [32]byte
	part[0] = 1
	k := respcache.IndexKey("rolter:cache", "/v1/chat/completions", "", "llama", part)
	if !regexp.MustCompile(`^rolter:cache:semantic:v2:[0-9a-f]{64}$`).MatchString(k) {
		t.Fatalf("IndexKey = %q", k)
	}
	for name, o := range map[string]string{
		"path":      respcache.IndexKey("rolter:cache", "/v1/messages", "", "llama", part),
		"scope":     respcache.IndexKey("rolter:cache", "/v1/chat/completions", "k", "llama", part),
		"route":     respcache.IndexKey("rolter:cache", "/v1/chat/completions", "", "qwen", part),
		"partition": respcache.IndexKey("rolter:cache", "/v1/chat/completions", "", "llama", [32]byte{}),
	} {
		if o == k {
			t.Errorf("another %s gives the same index key", name)
		}
	}
	if got := respcache.EntryKey(k, "abc"); got != k+":entry:abc" {
		t.Fatalf("EntryKey = %q", got)
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                 true,
		"Text/Event-Stream; charset=utf-8":  true,
		" text/event-stream ;charset=utf-8": true,
		"application/json":                  false,
		"text/event-streams":                false,
		"":                                  false,
	} {
		if got := respcache.IsEventStream(ct); got != want {
			t.Errorf("IsEventStream(%q) = %v", ct, got)
		}
	}
}
