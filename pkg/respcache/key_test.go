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

// TestVariantKeys: a variant is part of the exact key and of the semantic
// index key; no variant shares a key with another or with the plain route,
// and an empty variant is the plain key.
func TestVariantKeys(t *testing.T) {
	body := []byte(`{"model":"m","messages":[]}`)
	plain, _ := respcache.ExactKey("ns", "/v1/chat/completions", "", body)
	seen := map[string]string{plain: "plain"}
	if k, _ := respcache.VariantExactKey("ns", "/v1/chat/completions", "", "", body); k != plain {
		t.Errorf("empty variant: %q, want the plain key %q", k, plain)
	}
	var part [32]byte
	plainIdx := respcache.IndexKey("ns", "/v1/chat/completions", "", "m", part)
	if k := respcache.VariantIndexKey("ns", "/v1/chat/completions", "", "m", "", part); k != plainIdx {
		t.Errorf("empty variant index: %q, want %q", k, plainIdx)
	}
	seenIdx := map[string]string{plainIdx: "plain"}
	for _, v := range []string{"stable", "canary", "a"} {
		k, err := respcache.VariantExactKey("ns", "/v1/chat/completions", "", v, body)
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := seen[k]; dup {
			t.Errorf("variant %q has the exact key of %s", v, other)
		}
		seen[k] = v
		ik := respcache.VariantIndexKey("ns", "/v1/chat/completions", "", "m", v, part)
		if other, dup := seenIdx[ik]; dup {
			t.Errorf("variant %q has the index key of %s", v, other)
		}
		seenIdx[ik] = v
	}
	// The variant is its own field: it cannot be spelled by the scope.
	a, _ := respcache.VariantExactKey("ns", "/p", "k", "v", body)
	b, _ := respcache.VariantExactKey("ns", "/p", "k\x1fv", "", body)
	if a == b {
		t.Error("scope and variant collide")
	}
}
