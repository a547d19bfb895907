package proxy

import (
	"fmt"
	"net/http"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/routing"
)

// VariantHeader is the request header that pins a variant (where the route
// allows it) and the response header that names the variant that answered.
const VariantHeader = "X-Rolter-Variant"

// assign fills x.pools: the plain route's pool, or the route's variants
// ranked for this request. The ranking is sticky per x-session-id, else per
// virtual key, else per request (its id), so a session keeps its variant
// across requests, proxies and reloads that only move weights. A pin
// (x-rolter-variant, honoured only with routes[].allow_variant_pin) sends
// the request to that variant alone.
func (p *Proxy) assign(x *exchange, r *http.Request) (*apiError, string) {
	rte := x.route
	if len(rte.names) == 0 {
		x.pools = []poolState{{pool: rte.pools[0]}}
		return nil, ""
	}
	if pin := r.Header.Get(VariantHeader); pin != "" && rte.cfg.AllowVariantPin {
		for i, name := range rte.names {
			if name == pin {
				x.pools = []poolState{{pool: rte.pools[i]}}
				x.assigned = name
				return nil, ""
			}
		}
		e := errInvalidRequest
		return &e, fmt.Sprintf("model %q has no variant %q", rte.cfg.Model, pin)
	}
	keyID := ""
	if x.key != nil {
		keyID = x.key.ID
	}
	key := routing.AssignmentKey(r.Header.Get(affinity.SessionHeader), keyID, x.id)
	var buf [8]int
	order := routing.RankVariants(buf[:0], key, rte.names, rte.weights)
	x.pools = make([]poolState, len(order))
	for k, i := range order {
		x.pools[k].pool = rte.pools[i]
	}
	x.assigned = x.pools[0].pool.variant
	return nil, ""
}
