package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/delivery"
	"rolter.dev/pkg/usage"
)

// Kind is a kind of stored object.
type Kind int

// The kinds of stored objects.
const (
	KindSettings Kind = iota + 1
	KindProvider
	KindRoute
	KindKey
)

// String is the kind's name as users see it.
func (k Kind) String() string {
	switch k {
	case KindSettings:
		return "settings"
	case KindProvider:
		return "provider"
	case KindRoute:
		return "route"
	case KindKey:
		return "key"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// ID names one stored object. The settings object has an empty name.
type ID struct {
	Kind Kind
	Name string
}

// String renders the ID as "route llama-3.1-8b".
func (id ID) String() string {
	if id.Kind == KindSettings {
		return "settings"
	}
	return id.Kind.String() + " " + strconv.Quote(id.Name)
}

// Meta holds an object's etcd revisions.
type Meta struct {
	CreateRevision int64
	ModRevision    int64
}

// Settings are the global sections of a config, stored as one object.
type Settings struct {
	Server   config.Server   `toml:"server"`
	Retry    config.Retry    `toml:"retry"`
	Cooldown config.Cooldown `toml:"cooldown"`
	Breaker  config.Breaker  `toml:"breaker"`
	Health   config.Health   `toml:"health"`
	Timeouts config.Timeouts `toml:"timeouts"`
	Cache    config.Cache    `toml:"cache"`

	// The delivery policy and accounting sections, kept with the other
	// global sections.
	Guardrails  delivery.GuardrailsConfig `toml:"guardrails"`
	Plugins     []delivery.PluginConfig   `toml:"plugins"`
	PII         delivery.PIIConfig        `toml:"pii_sanitizer"`
	ModelPrices []usage.ModelPrice        `toml:"model_prices"`
	Accounting  usage.AccountingConfig    `toml:"accounting"`
}

// State is the stored configuration at one revision.
type State struct {
	// Revision is the config revision: the etcd revision of the last
	// config change, 0 before the first one.
	Revision int64
	// ClusterID is the etcd cluster's ID; revisions compare only within one.
	ClusterID uint64

	Settings Settings
	// Providers, Routes and Keys are sorted by name (model for routes).
	Providers []config.Provider
	Routes    []config.Route
	Keys      []config.VirtualKey
	// Meta holds the revisions of each stored object.
	Meta map[ID]Meta
}

// Empty returns the state of an empty store: default settings, no objects.
func Empty() *State {
	d := config.Default()
	return &State{Settings: settingsOf(&d), Meta: map[ID]Meta{}}
}

func settingsOf(c *config.Config) Settings {
	return Settings{
		Server: c.Server, Retry: c.Retry, Cooldown: c.Cooldown, Breaker: c.Breaker,
		Health: c.Health, Timeouts: c.Timeouts, Cache: c.Cache,
		Guardrails: c.Guardrails, Plugins: slices.Clone(c.Plugins), PII: c.PII,
		ModelPrices: slices.Clone(c.ModelPrices), Accounting: c.Accounting,
	}
}

// FromConfig builds the state a parsed and validated config describes.
// Inline virtual-key secrets are replaced by their digests under pepper, so
// the result holds no key secret. Meta is empty.
func FromConfig(c *config.Config, pepper []byte) *State {
	s := &State{
		Settings:  settingsOf(c),
		Providers: slices.Clone(c.Providers),
		Routes:    slices.Clone(c.Routes),
		Keys:      slices.Clone(c.VirtualKeys),
		Meta:      map[ID]Meta{},
	}
	for i := range s.Keys {
		k := &s.Keys[i]
		if k.Key != "" {
			k.KeyDigest = config.DigestKey(pepper, k.Key).String()
			k.Key = ""
		}
	}
	s.sort()
	return s
}

func (s *State) sort() {
	slices.SortFunc(s.Providers, func(a, b config.Provider) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Routes, func(a, b config.Route) int { return strings.Compare(a.Model, b.Model) })
	slices.SortFunc(s.Keys, func(a, b config.VirtualKey) int { return strings.Compare(a.Name, b.Name) })
}

// Clone returns a copy whose lists and meta may be changed freely. Objects
// are replaced whole, never edited in place, so they are shared.
func (s *State) Clone() *State {
	c := *s
	c.Providers = slices.Clone(s.Providers)
	c.Routes = slices.Clone(s.Routes)
	c.Keys = slices.Clone(s.Keys)
	c.Meta = make(map[ID]Meta, len(s.Meta))
	for k, v := range s.Meta {
		c.Meta[k] = v
	}
	return &c
}

// Config returns the state as a config, objects in name order.
func (s *State) Config() *config.Config {
	st := s.Settings
	return &config.Config{
		Server: st.Server, Retry: st.Retry, Cooldown: st.Cooldown, Breaker: st.Breaker,
		Health: st.Health, Timeouts: st.Timeouts, Cache: st.Cache,
		Guardrails: st.Guardrails, Plugins: slices.Clone(st.Plugins), PII: st.PII,
		ModelPrices: slices.Clone(st.ModelPrices), Accounting: st.Accounting,
		Providers:   slices.Clone(s.Providers),
		Routes:      slices.Clone(s.Routes),
		VirtualKeys: slices.Clone(s.Keys),
	}
}

// Provider returns the named provider and true, or false.
func (s *State) Provider(name string) (config.Provider, bool) {
	i := slices.IndexFunc(s.Providers, func(p config.Provider) bool { return p.Name == name })
	if i < 0 {
		return config.Provider{}, false
	}
	return s.Providers[i], true
}

// Route returns the route of model and true, or false.
func (s *State) Route(model string) (config.Route, bool) {
	i := slices.IndexFunc(s.Routes, func(r config.Route) bool { return r.Model == model })
	if i < 0 {
		return config.Route{}, false
	}
	return s.Routes[i], true
}

// Key returns the named key and true, or false.
func (s *State) Key(name string) (config.VirtualKey, bool) {
	i := slices.IndexFunc(s.Keys, func(k config.VirtualKey) bool { return k.Name == name })
	if i < 0 {
		return config.VirtualKey{}, false
	}
	return s.Keys[i], true
}

// PutProvider adds or replaces a provider.
func (s *State) PutProvider(p config.Provider) {
	s.Providers = put(s.Providers, p, func(x config.Provider) bool { return x.Name == p.Name })
	s.sort()
}

// PutRoute adds or replaces a route.
func (s *State) PutRoute(r config.Route) {
	s.Routes = put(s.Routes, r, func(x config.Route) bool { return x.Model == r.Model })
	s.sort()
}

// PutKey adds or replaces a key.
func (s *State) PutKey(k config.VirtualKey) {
	s.Keys = put(s.Keys, k, func(x config.VirtualKey) bool { return x.Name == k.Name })
	s.sort()
}

// Delete removes an object and reports whether it existed.
func (s *State) Delete(id ID) bool {
	n := 0
	switch id.Kind {
	case KindProvider:
		n = len(s.Providers)
		s.Providers = slices.DeleteFunc(s.Providers, func(p config.Provider) bool { return p.Name == id.Name })
		n -= len(s.Providers)
	case KindRoute:
		n = len(s.Routes)
		s.Routes = slices.DeleteFunc(s.Routes, func(r config.Route) bool { return r.Model == id.Name })
		n -= len(s.Routes)
	case KindKey:
		n = len(s.Keys)
		s.Keys = slices.DeleteFunc(s.Keys, func(k config.VirtualKey) bool { return k.Name == id.Name })
		n -= len(s.Keys)
	}
	return n > 0
}

func put[T any](list []T, v T, same func(T) bool) []T {
	if i := slices.IndexFunc(list, same); i >= 0 {
		list = slices.Clone(list)
		list[i] = v
		return list
	}
	return append(slices.Clone(list), v)
}

// Objects returns every stored object by ID: the settings, providers,
// routes and keys.
func (s *State) Objects() map[ID]any {
	out := make(map[ID]any, 1+len(s.Providers)+len(s.Routes)+len(s.Keys))
	out[ID{Kind: KindSettings}] = s.Settings
	for _, p := range s.Providers {
		out[ID{KindProvider, p.Name}] = p
	}
	for _, r := range s.Routes {
		out[ID{KindRoute, r.Model}] = r
	}
	for _, k := range s.Keys {
		out[ID{KindKey, k.Name}] = k
	}
	return out
}

// Encode renders every object as the TOML stored in etcd.
func (s *State) Encode() (map[ID][]byte, error) {
	out := make(map[ID][]byte)
	for id, obj := range s.Objects() {
		b, err := MarshalTOML(obj)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", id, err)
		}
		out[id] = b
	}
	return out, nil
}

// Decode rebuilds a state from stored objects. Each value is decoded
// strictly (an unknown key is an error) and must name the object its key
// names. An absent settings object means the defaults.
func Decode(objs map[ID][]byte) (*State, error) {
	s := Empty()
	var errs []error
	for id, b := range objs {
		var err error
		switch id.Kind {
		case KindSettings:
			st := s.Settings
			if err = decodeStrict(b, &st); err == nil {
				s.Settings = st
			}
		case KindProvider:
			var p config.Provider
			if err = decodeStrict(b, &p); err == nil && p.Name != id.Name {
				err = fmt.Errorf("names %q", p.Name)
			}
			s.Providers = append(s.Providers, p)
		case KindRoute:
			var r config.Route
			if err = decodeStrict(b, &r); err == nil && r.Model != id.Name {
				err = fmt.Errorf("names %q", r.Model)
			}
			s.Routes = append(s.Routes, r)
		case KindKey:
			var k config.VirtualKey
			if err = decodeStrict(b, &k); err == nil && k.Name != id.Name {
				err = fmt.Errorf("names %q", k.Name)
			}
			if err == nil && k.Key != "" {
				err = errors.New("holds a key secret")
			}
			s.Keys = append(s.Keys, k)
		default:
			err = errors.New("unknown kind")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("stored %s: %w", id, err))
		}
	}
	s.sort()
	return s, errors.Join(errs...)
}

func decodeStrict(b []byte, v any) error {
	dec := toml.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Check is the consistency check run before a state is stored or
// published: validation and a trial compilation with pkg/config, with
// placeholder values for the environment variables and files that data
// planes resolve themselves. Failures are [*config.FieldError]s joined,
// their paths naming objects (`routes["llama"].targets[0].provider`).
func (s *State) Check() error {
	return Relabel(check(s.Config()), s.Config())
}

// CheckConfig runs the same check on a config as written, keeping its
// indexed paths (they point into the document the user sent).
func CheckConfig(c *config.Config) error { return check(c) }

func check(c *config.Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	c2 := *c
	c2.Server.KeyPepper = "placeholder-pepper"
	_, err := config.Compile(&c2, config.CompileOptions{
		LookupEnv: func(name string) (string, bool) {
			if name == "ROLTER_KEY_PEPPER" {
				return "", false
			}
			return "placeholder-for-" + name, true
		},
		ReadFile: func(string) ([]byte, error) { return []byte("placeholder"), nil },
	})
	return err
}

var indexed = regexp.MustCompile(`^(providers|routes|virtual_keys)\[(\d+)\]`)

// Relabel rewrites the list indexes of field paths in err to the names of
// the objects of c: `routes[3].strategy` becomes `routes["llama"].strategy`.
func Relabel(err error, c *config.Config) error {
	if err == nil {
		return nil
	}
	var out []error
	for _, e := range unjoin(err) {
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			out = append(out, e)
			continue
		}
		path := indexed.ReplaceAllStringFunc(fe.Path, func(m string) string {
			sub := indexed.FindStringSubmatch(m)
			i, _ := strconv.Atoi(sub[2])
			name := ""
			switch sub[1] {
			case "providers":
				if i < len(c.Providers) {
					name = c.Providers[i].Name
				}
			case "routes":
				if i < len(c.Routes) {
					name = c.Routes[i].Model
				}
			case "virtual_keys":
				if i < len(c.VirtualKeys) {
					name = c.VirtualKeys[i].Name
				}
			}
			if name == "" {
				return m
			}
			return sub[1] + "[" + strconv.Quote(name) + "]"
		})
		out = append(out, &config.FieldError{Path: path, Msg: fe.Msg})
	}
	return errors.Join(out...)
}

// Unjoin returns the errors joined in err (err itself if it is not a join).
func Unjoin(err error) []error { return unjoin(err) }

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // walking a join, not matching
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

// RenderOptions selects what a rendered snapshot leaves out.
type RenderOptions struct {
	// NoKeys leaves out virtual keys (digests included).
	NoKeys bool
	// NoInlineSecrets blanks inline provider API keys.
	NoInlineSecrets bool
}

// Render writes the state as a whole config in the file-mode TOML schema,
// the payload pushed to nodes, and its hex SHA-256.
func (s *State) Render(o RenderOptions) ([]byte, string, error) {
	c := s.Config()
	c.Server.KeyPepper = ""
	if o.NoKeys {
		c.VirtualKeys = nil
	}
	if o.NoInlineSecrets {
		for i := range c.Providers {
			c.Providers[i].APIKey = ""
		}
	}
	b, err := MarshalTOML(c)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:]), nil
}
