package store

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"rolter.dev/controlplane/internal/state"
)

// DefaultPrefix is the etcd key prefix of everything rolter stores. The
// version in it changes only with an incompatible layout.
const DefaultPrefix = "/rolter/v1/"

// Layout maps objects to etcd keys:
//
//	<prefix>config/settings             the global sections (TOML)
//	<prefix>config/providers/<name>     one [[providers]] entry (TOML)
//	<prefix>config/routes/<model>       one [[routes]] entry (TOML)
//	<prefix>config/keys/<name>          one [[virtual_keys]] entry (TOML, key_digest only)
//	<prefix>config/revision             touched by every config write; its
//	                                    mod_revision is the config version
//	                                    (a write made with etcdctl must touch
//	                                    it too, or nodes will not see it)
//	<prefix>nodes/<node_id>             node status (JSON, leased by its control plane)
//	<prefix>controlplanes/<id>          replica status (JSON, leased)
//	<prefix>pepper_check                fingerprint of the key pepper
//
// Names are path-escaped (a model "org/model" is stored as "org%2Fmodel").
type Layout struct {
	prefix string
}

// NewLayout returns the layout under prefix (DefaultPrefix when empty).
func NewLayout(prefix string) Layout {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Layout{prefix: prefix}
}

// ConfigPrefix is the prefix of every config key, marker included.
func (l Layout) ConfigPrefix() string { return l.prefix + "config/" }

// Marker is the key every config write touches.
func (l Layout) Marker() string { return l.prefix + "config/revision" }

// NodesPrefix is the prefix of node status keys.
func (l Layout) NodesPrefix() string { return l.prefix + "nodes/" }

// Node is the status key of one node.
func (l Layout) Node(id string) string { return l.NodesPrefix() + url.PathEscape(id) }

// ControlPlanesPrefix is the prefix of replica status keys.
func (l Layout) ControlPlanesPrefix() string { return l.prefix + "controlplanes/" }

// ControlPlane is the status key of one replica.
func (l Layout) ControlPlane(id string) string { return l.ControlPlanesPrefix() + url.PathEscape(id) }

// PepperCheck is the key holding the key pepper's fingerprint.
func (l Layout) PepperCheck() string { return l.prefix + "pepper_check" }

var kindDirs = map[state.Kind]string{
	state.KindProvider: "providers/",
	state.KindRoute:    "routes/",
	state.KindKey:      "keys/",
}

// Key is the etcd key of an object.
func (l Layout) Key(id state.ID) string {
	if id.Kind == state.KindSettings {
		return l.ConfigPrefix() + "settings"
	}
	return l.ConfigPrefix() + kindDirs[id.Kind] + url.PathEscape(id.Name)
}

// ErrNotObject is returned by [Layout.Parse] for the marker key.
var ErrNotObject = errors.New("store: not an object key")

// Parse maps a config key back to its object. It accepts only the exact
// keys [Layout.Key] produces.
func (l Layout) Parse(key string) (state.ID, error) {
	rest, ok := strings.CutPrefix(key, l.ConfigPrefix())
	switch {
	case !ok:
		return state.ID{}, fmt.Errorf("store: key %q is outside %s", key, l.ConfigPrefix())
	case key == l.Marker():
		return state.ID{}, ErrNotObject
	case rest == "settings":
		return state.ID{Kind: state.KindSettings}, nil
	}
	for kind, dir := range kindDirs {
		esc, ok := strings.CutPrefix(rest, dir)
		if !ok {
			continue
		}
		name, err := url.PathUnescape(esc)
		if err != nil || name == "" || url.PathEscape(name) != esc {
			return state.ID{}, fmt.Errorf("store: key %q: bad object name", key)
		}
		return state.ID{Kind: kind, Name: name}, nil
	}
	return state.ID{}, fmt.Errorf("store: key %q: unknown object kind", key)
}
