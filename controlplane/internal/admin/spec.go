package admin

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"rolter.dev/controlplane/internal/state"
	"rolter.dev/pkg/config"
	pb "rolter.dev/proto/rolter/controlplane/v1"
)

// redacted replaces an inline API key in responses; sent back in an
// update, it means "keep the stored key".
const redacted = "<redacted>"

// decodeEntry decodes one list entry given as a JSON-like spec by passing
// it through the same strict TOML decoder as file mode: list is the TOML
// array ("providers", "routes") and name labels error paths.
func decodeEntry(list, name string, spec *structpb.Struct) (*config.Config, error) {
	if spec == nil {
		return nil, &config.FieldError{Path: list + "[" + strconv.Quote(name) + "]", Msg: "spec is required"}
	}
	doc, err := toml.Marshal(map[string]any{list: []any{normalize(spec.AsMap())}})
	if err != nil {
		return nil, &config.FieldError{Path: list, Msg: err.Error()}
	}
	cfg, err := config.Parse(doc)
	if err != nil {
		return nil, relabelFirst(err, list, name)
	}
	return cfg, nil
}

var first = regexp.MustCompile(`^(providers|routes|virtual_keys)\[0\]`)

func relabelFirst(err error, list, name string) error {
	var out []error
	for _, e := range state.Unjoin(err) {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			out = append(out, &config.FieldError{Path: first.ReplaceAllString(fe.Path, list+"["+strconv.Quote(name)+"]"), Msg: fe.Msg})
		} else {
			out = append(out, &config.FieldError{Path: list + "[" + strconv.Quote(name) + "]", Msg: e.Error()})
		}
	}
	return errors.Join(out...)
}

// normalize turns JSON numbers that are whole into integers, so that
// `"weight": 2` decodes into an int field (TOML floats do not) while
// `"threshold": 1` still decodes into a float field.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	}
	return v
}

// specOf renders a stored object as a spec, inline API keys redacted.
func specOf(obj any) *structpb.Struct {
	t, _ := state.Tree(obj).(map[string]any)
	m, _ := jsonish(t).(map[string]any)
	if k, ok := m["api_key"].(string); ok && k != "" {
		m["api_key"] = redacted
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return &structpb.Struct{}
	}
	return s
}

func jsonish(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonish(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonish(e)
		}
		return out
	case int64:
		return float64(x)
	case time.Time:
		return x.Format(time.RFC3339Nano)
	}
	return v
}

func providerProto(p config.Provider, m state.Meta) *pb.Provider {
	return &pb.Provider{Name: p.Name, Spec: specOf(p), CreateRevision: m.CreateRevision, ModRevision: m.ModRevision}
}

func routeProto(r config.Route, m state.Meta) *pb.Route {
	return &pb.Route{Model: r.Model, Spec: specOf(r), CreateRevision: m.CreateRevision, ModRevision: m.ModRevision}
}

func keyProto(k config.VirtualKey, m state.Meta) *pb.VirtualKey {
	out := &pb.VirtualKey{
		Name: k.Name, Models: k.Models, Providers: k.Providers, Disabled: k.Disabled, Cache: k.Cache,
		CreateRevision: m.CreateRevision, ModRevision: m.ModRevision,
	}
	if k.ExpiresAt != nil {
		out.ExpiresAt = timestamppb.New(*k.ExpiresAt)
	}
	switch {
	case k.KeyDigest != "":
		out.SecretSource = "digest"
		out.DigestPrefix = k.KeyDigest[:min(12, len(k.KeyDigest))]
	case k.KeyEnv != "":
		out.SecretSource = "env:" + k.KeyEnv
	}
	return out
}

// keyRules copies the rules of a key message onto k (the secret fields of
// k are kept).
func keyRules(k *config.VirtualKey, in *pb.VirtualKey) error {
	k.Models, k.Providers, k.Disabled, k.Cache = in.GetModels(), in.GetProviders(), in.GetDisabled(), in.Cache
	k.ExpiresAt = nil
	if in.GetExpiresAt() != nil {
		if err := in.GetExpiresAt().CheckValid(); err != nil {
			return &config.FieldError{Path: fmt.Sprintf("virtual_keys[%q].expires_at", k.Name), Msg: err.Error()}
		}
		t := in.GetExpiresAt().AsTime()
		k.ExpiresAt = &t
	}
	return nil
}

func structValue(s string) *structpb.Value { return structpb.NewStringValue(s) }
