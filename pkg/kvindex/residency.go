package kvindex

import (
	"time"

	"rolter.dev/pkg/kvdelta"
)

// sweepEvery is how often Speculate drops expired speculative entries.
const sweepEvery = time.Second

// MaxSpeculative bounds a provider's speculative entries: 2^20 blocks, more
// than any one engine's GPU cache holds (16 M tokens at 16 per block), so
// speculation beyond it says nothing about where a prefix is. Without it
// the entries were bounded only by their TTL, and clients sending long
// token-id headers fast could grow them without limit.
const MaxSpeculative = 1 << 20

// Residency is one provider's resident block identities plus the
// speculative entries a proxy added after routing requests there: the
// state behind [Index.PrefixMatch] and [Index.Speculate], without the NATS
// plumbing and on the caller's clock (now is nanoseconds on any clock that
// does not go back; Index passes Unix time, the routing simulator its
// virtual clock). The zero value is empty and ready to use. It is not safe
// for concurrent use: Index guards each provider's with that provider's
// lock.
type Residency struct {
	resident  map[uint64]struct{}
	spec      map[uint64]int64 // identity → expiry
	lastSweep int64
}

// Apply applies a delta's ops in order. A stored or removed identity drops
// its speculative entry (the engine has spoken for it); a clear drops them
// all.
func (r *Residency) Apply(ops []kvdelta.Op) {
	for i := range ops {
		op := &ops[i]
		switch op.Kind {
		case kvdelta.OpStored:
			if r.resident == nil {
				r.resident = make(map[uint64]struct{}, len(op.IDs))
			}
			for _, id := range op.IDs {
				r.resident[id] = struct{}{}
			}
			if len(r.spec) > 0 {
				for _, id := range op.IDs {
					delete(r.spec, id)
				}
			}
		case kvdelta.OpRemoved:
			for _, id := range op.IDs {
				delete(r.resident, id)
				delete(r.spec, id)
			}
		case kvdelta.OpCleared:
			clear(r.resident)
			clear(r.spec)
		}
	}
}

// Replace makes ids the resident set (a snapshot), keeping speculative
// entries: they still stand for requests routed since.
func (r *Residency) Replace(ids []uint64) {
	r.resident = make(map[uint64]struct{}, len(ids))
	for _, id := range ids {
		r.resident[id] = struct{}{}
	}
}

// PrefixMatch returns how many of ids, from the first, are resident or
// speculatively held past now. now is read only when speculative entries
// exist (see [Residency.Speculating]), so a caller may pass 0 otherwise.
func (r *Residency) PrefixMatch(ids []uint64, now int64) int {
	for i, id := range ids {
		if _, ok := r.resident[id]; ok {
			continue
		}
		if exp, ok := r.spec[id]; ok && exp > now {
			continue
		}
		return i
	}
	return len(ids)
}

// Speculating reports whether any speculative entry exists (expired or
// not): whether PrefixMatch needs the time.
func (r *Residency) Speculating() bool { return len(r.spec) > 0 }

// Speculate marks the identities of ids not already resident as held until
// now+ttl, and drops expired entries at most once a second.
func (r *Residency) Speculate(ids []uint64, now int64, ttl time.Duration) {
	r.speculate(ids, now, ttl, nil, false)
}

// SpeculateAppend is Speculate, appending to dst the identities it marked:
// what another proxy does not know the provider holds until its events
// say so (see rolter.dev/pkg/routing.KVSharedSource).
func (r *Residency) SpeculateAppend(ids []uint64, now int64, ttl time.Duration, dst []uint64) []uint64 {
	return r.speculate(ids, now, ttl, dst, true)
}

func (r *Residency) speculate(ids []uint64, now int64, ttl time.Duration, dst []uint64, collect bool) []uint64 {
	if len(ids) == 0 || ttl <= 0 {
		return dst
	}
	if r.spec == nil {
		r.spec = make(map[uint64]int64, len(ids))
	}
	// The sweep keeps its pace when full too: sweeping a full map on
	// every call would cost each request a pass over 2^20 entries.
	if now-r.lastSweep > int64(sweepEvery) {
		r.lastSweep = now
		for id, e := range r.spec {
			if e <= now {
				delete(r.spec, id)
			}
		}
	}
	exp := now + int64(ttl)
	for _, id := range ids {
		if _, ok := r.resident[id]; ok {
			continue
		}
		if _, ok := r.spec[id]; !ok && len(r.spec) >= MaxSpeculative {
			return dst // full until the next sweep: a request's leading blocks came first
		}
		r.spec[id] = exp
		if collect {
			dst = append(dst, id)
		}
	}
	return dst
}

// Len returns how many identities are resident and how many speculative
// entries are held (expired ones included until the next sweep).
func (r *Residency) Len() (resident, speculative int) { return len(r.resident), len(r.spec) }
