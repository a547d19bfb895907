package reliability

import "sync"

// TargetKey identifies a route target across reloads.
type TargetKey struct {
	Route    string // public model name
	Provider string
	Model    string // upstream model
}

// Registry owns the live state of every target and provider ever seen by a
// process. It is safe for concurrent use. State of targets that leave the
// config stays until [Registry.Retain] drops it.
type Registry struct {
	targets   sync.Map // TargetKey → *Target
	providers sync.Map // string → *Provider
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

// Target returns the state of k, creating it on first use.
func (r *Registry) Target(k TargetKey) *Target {
	if v, ok := r.targets.Load(k); ok {
		return v.(*Target)
	}
	v, _ := r.targets.LoadOrStore(k, &Target{key: k})
	return v.(*Target)
}

// Provider returns the health state of the named provider, creating it
// (healthy) on first use.
func (r *Registry) Provider(name string) *Provider {
	if v, ok := r.providers.Load(name); ok {
		return v.(*Provider)
	}
	p := &Provider{name: name}
	p.healthy.Store(true)
	v, _ := r.providers.LoadOrStore(name, p)
	return v.(*Provider)
}

// Retain drops the state of targets and providers the keep functions reject.
// Call it after a reload with the new config's membership; in-flight
// requests holding a dropped *Target finish normally.
func (r *Registry) Retain(keepTarget func(TargetKey) bool, keepProvider func(string) bool) {
	r.targets.Range(func(k, v any) bool {
		if !keepTarget(k.(TargetKey)) && v.(*Target).InFlight() == 0 {
			r.targets.Delete(k)
		}
		return true
	})
	r.providers.Range(func(k, _ any) bool {
		if !keepProvider(k.(string)) {
			r.providers.Delete(k)
		}
		return true
	})
}
