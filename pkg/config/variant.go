package config

import (
	"fmt"
	"strings"
	"time"
)

// MaxVariants is the most variants one route may have.
const MaxVariants = 32

// DefaultVariantWeight is [[routes.variants]] weight when absent.
const DefaultVariantWeight = 1

// Variant is one arm of a route's weighted split (an A/B test, a canary):
// its own targets, strategy and balancer behind the route's public model.
// Targets, Strategy and Balancer left out take the route's own.
type Variant struct {
	// Name identifies the variant in the x-rolter-variant header, metrics,
	// logs and usage rows; unique within the route.
	Name string `toml:"name"`
	// Weight is the variant's share of assignments (weight / the sum of the
	// route's weights); 0 drains it: it is then reached only by a pin.
	Weight   *int      `toml:"weight"`
	Targets  []Target  `toml:"targets"`
	Strategy string    `toml:"strategy"`
	Balancer *Balancer `toml:"balancer"`
}

// CompiledVariant is a variant with the route's defaults applied and its
// targets bound to providers.
type CompiledVariant struct {
	Name     string
	Weight   int
	Strategy string
	Targets  []CompiledTarget
	// Balancer and SpeculativeTTL as in [CompiledRoute].
	Balancer       Balancer
	SpeculativeTTL time.Duration
}

func applyVariantDefaults(r *Route) {
	for i := range r.Variants {
		v := &r.Variants[i]
		if v.Weight == nil {
			v.Weight = ptr(DefaultVariantWeight)
		}
		for j := range v.Targets {
			if v.Targets[j].Weight == nil {
				v.Targets[j].Weight = ptr(1)
			}
		}
	}
}

// validateVariants checks routes[i].variants and route-level keys that only
// apply with variants.
func validateVariants(v *validator, path string, r *Route, providers map[string]int) {
	if len(r.Variants) == 0 {
		if r.AllowVariantPin {
			v.add(path+".allow_variant_pin", "only applies to a route with variants")
		}
		return
	}
	if len(r.Variants) > MaxVariants {
		v.add(path+".variants", "at most %d variants, got %d", MaxVariants, len(r.Variants))
	}
	names := make(map[string]int, len(r.Variants))
	sum := 0
	for j := range r.Variants {
		vr := &r.Variants[j]
		vp := fmt.Sprintf("%s.variants[%d]", path, j)
		switch {
		case vr.Name == "":
			v.add(vp+".name", "must not be empty")
		case !namePattern.MatchString(vr.Name) || len(vr.Name) > 64:
			v.add(vp+".name", "must match %s (at most 64 characters), got %q", namePattern, vr.Name)
		default:
			if first, dup := names[vr.Name]; dup {
				v.add(vp+".name", "duplicate variant %q (also %s.variants[%d])", vr.Name, path, first)
			} else {
				names[vr.Name] = j
			}
		}
		if vr.Weight != nil {
			if w := *vr.Weight; w < 0 || w > 1_000_000 {
				v.add(vp+".weight", "must be in [0, 1000000], got %d", w)
			} else {
				sum += w
			}
		}
		if vr.Strategy != "" && !contains(Strategies, vr.Strategy) {
			v.add(vp+".strategy", "unknown strategy %q (want one of %s)", vr.Strategy, strings.Join(Strategies, ", "))
		}
		switch {
		case len(vr.Targets) == 0 && len(r.Targets) == 0:
			v.add(vp+".targets", "must have at least one target (its own or the route's)")
		case len(vr.Targets) > MaxTargets:
			v.add(vp+".targets", "at most %d targets, got %d", MaxTargets, len(vr.Targets))
		}
		validateTargets(v, vp+".targets", vr.Targets, providers)
		if vr.Balancer != nil {
			validateBalancer(v, vp+".balancer", vr.Balancer)
		}
	}
	if sum == 0 && len(r.Variants) <= MaxVariants {
		v.add(path+".variants", "the weights must sum to more than 0")
	}
}

// compileVariants fills cr.Variants; the route's targets, strategy and
// balancer stand in for the ones a variant leaves out.
func (s *Snapshot) compileVariants(r *Route, cr *CompiledRoute) {
	cr.AllowVariantPin = r.AllowVariantPin
	for _, vr := range r.Variants {
		cv := CompiledVariant{
			Name: vr.Name, Weight: *vr.Weight, Strategy: vr.Strategy,
			Balancer: cr.Balancer, SpeculativeTTL: cr.SpeculativeTTL,
			Targets: cr.Targets,
		}
		if cv.Strategy == "" {
			cv.Strategy = cr.Strategy
		}
		if vr.Balancer != nil {
			cv.Balancer, cv.SpeculativeTTL = compileBalancer(*vr.Balancer)
		}
		if len(vr.Targets) > 0 {
			cv.Targets = s.compileTargets(r.Model, vr.Targets)
		}
		cr.Variants = append(cr.Variants, cv)
	}
}

// Variant returns the named variant of the route, or nil.
func (r *CompiledRoute) Variant(name string) *CompiledVariant {
	for i := range r.Variants {
		if r.Variants[i].Name == name {
			return &r.Variants[i]
		}
	}
	return nil
}
