package store_test

import (
	"errors"
	"testing"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/controlplane/internal/store"
)

func TestLayout(t *testing.T) {
	l := store.NewLayout("")
	tests := []struct {
		name string
		id   state.ID
		key  string
	}{
		{name: "settings", id: state.ID{Kind: state.KindSettings}, key: "/rolter/v1/config/settings"},
		{name: "provider", id: state.ID{Kind: state.KindProvider, Name: "vllm-a"}, key: "/rolter/v1/config/providers/vllm-a"},
		{name: "route with a slash and a space", id: state.ID{Kind: state.KindRoute, Name: "org/llama 3"}, key: "/rolter/v1/config/routes/org%2Fllama%203"},
		{name: "key", id: state.ID{Kind: state.KindKey, Name: "team-a"}, key: "/rolter/v1/config/keys/team-a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := l.Key(tc.id); got != tc.key {
				t.Errorf("Key = %q, want %q", got, tc.key)
			}
			if got, err := l.Parse(tc.key); err != nil || got != tc.id {
				t.Errorf("Parse = %v, %v", got, err)
			}
		})
	}
	for _, bad := range []string{"/rolter/v1/config/routes/", "/rolter/v1/config/routes/a%2", "/rolter/v1/config/routes/a/b",
		"/rolter/v1/config/widgets/x", "/rolter/v1/nodes/x", "/rolter/v1/config/routes/%61"} {
		if id, err := l.Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, id)
		}
	}
	if _, err := l.Parse(l.Marker()); !errors.Is(err, store.ErrNotObject) {
		t.Errorf("marker: %v", err)
	}
}

// FuzzLayoutParse: Parse never panics, and accepts exactly the keys that
// Key produces.
func FuzzLayoutParse(f *testing.F) {
	l := store.NewLayout("/p/")
	for _, s := range []string{"/p/config/routes/a%2Fb", "/p/config/settings", "/p/config/keys/", "/p/config/revision", "x", "/p/config/providers/%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		id, err := l.Parse(key)
		if err != nil {
			return
		}
		if back := l.Key(id); back != key {
			t.Errorf("Parse(%q) = %v, whose key is %q", key, id, back)
		}
	})
}
