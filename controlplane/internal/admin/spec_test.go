package admin

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/pkg/config"
)

func spec(t *testing.T, js string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecodeEntry(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		wantErr string
		check   func(*testing.T, config.Route)
	}{
		{name: "ok: whole JSON numbers decode into ints and floats", json: `{"model":"m","strategy":"cache_aware","targets":[{"provider":"a","weight":3}],"balancer":{"threshold":1,"balance_abs":4}}`,
			check: func(t *testing.T, r config.Route) {
				if *r.Targets[0].Weight != 3 || r.Balancer.Threshold != 1 || r.Balancer.BalanceAbs != 4 {
					t.Errorf("route %+v", r)
				}
			}},
		{name: "ok: defaults applied", json: `{"model":"m","targets":[{"provider":"a"}]}`,
			check: func(t *testing.T, r config.Route) {
				if r.Strategy != "round_robin" || *r.Targets[0].Weight != 1 {
					t.Errorf("route %+v", r)
				}
			}},
		{name: "error: unknown key names its path and the object", json: `{"model":"m","targets":[{"provider":"a","wieght":2}]}`,
			wantErr: `routes["m"].targets[0].wieght: unknown key (did you mean "weight"?)`},
		{name: "error: a fractional weight", json: `{"model":"m","targets":[{"provider":"a","weight":1.5}]}`,
			wantErr: `routes["m"].targets[0].weight: expected an integer, got a float`},
		{name: "error: wrong type", json: `{"model":"m","targets":"a"}`, wantErr: `routes["m"].targets: expected an array, got a string`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := decodeEntry("routes", "m", spec(t, tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg.Routes[0])
		})
	}
	if _, err := decodeEntry("routes", "m", nil); err == nil {
		t.Error("a nil spec was accepted")
	}
}

func TestSpecOfRedactsInlineKeys(t *testing.T) {
	s := specOf(config.Provider{Name: "p", Kind: "openai", APIBase: "https://x", APIKey: "sk-inline-secret"})
	b, _ := s.MarshalJSON()
	if strings.Contains(string(b), "sk-inline-secret") || !strings.Contains(string(b), redacted) {
		t.Errorf("spec: %s", b)
	}
}

// FuzzDecodeEntry: an admin client's spec is outside input. Whatever JSON
// object it is, decodeEntry returns a field error under the entry's own
// path, or a config holding exactly that one entry; it never panics.
func FuzzDecodeEntry(f *testing.F) {
	f.Add(true, []byte(`{"name":"p","kind":"openai_compatible","api_base":"http://x"}`))
	f.Add(false, []byte(`{"model":"m","targets":[{"provider":"p","weight":2}],"strategy":"predicted_ttft"}`))
	f.Add(true, []byte(`{"name":"p","kind":"x","timeout":1.5,"extra":{"a":[null,true]}}`))
	f.Fuzz(func(t *testing.T, provider bool, js []byte) {
		var s structpb.Struct
		if s.UnmarshalJSON(js) != nil {
			return
		}
		list := map[bool]string{true: "providers", false: "routes"}[provider]
		cfg, err := decodeEntry(list, "entry", &s)
		if err != nil {
			for _, e := range state.Unjoin(err) {
				var fe *config.FieldError
				if !errors.As(e, &fe) || fe.Path != "" && !strings.HasPrefix(fe.Path, list) {
					t.Fatalf("error %v (%T) outside %s", e, e, list)
				}
			}
			return
		}
		if n := len(cfg.Providers) + len(cfg.Routes); n != 1 {
			t.Fatalf("%d entries from one spec", n)
		}
	})
}
