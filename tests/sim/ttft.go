package sim

import (
	"fmt"
	"time"

	"rolter.dev/pkg/config"
	"rolter.dev/pkg/kvdelta"
	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/routing"
)

// ttftPolicy runs pkg/routing's predicted_ttft as the proxy does: Pick and
// Observe as for every balancer, FirstToken with the request's TTFT and its
// prompt token count (the engine's usage.prompt_tokens), and, unless
// turned off, the engines' state (routing.EngineState: each replica's
// num_requests_waiting and num_requests_running and its KV capacity, read
// without scrape lag, as for llm-d's queue scorer) and the proxy's index of the replicas' KV events
// (routing.KVSource, the token ids the proxy obtains from the engine's
// /tokenize). Options: predicted_ttft:kv_events=0 has neither token ids
// nor KV events (the approximate index only); :engine=0 scrapes nothing
// (no waiting counts; the approximate index falls back to the seed's
// ceiling); :stream=P has only the share P of the sessions stream (a
// session's draw is fixed), the others not (Context.Buffered): the proxy
// sees no first token of theirs, and tells the balancer the whole answer
// (WholeAnswer) at completion; :turns=0 picks every request at once, with
// no turn in a burst (routing.Deferrer); :scale_s=S routes over every
// replica but the last until S seconds into the run, when the last joins
// the route and the proxy reloads it: a new balancer over every replica,
// which inherits what the old one learned (routing.Inheritor) unless
// :inherit=0; :drain_s=S likewise takes the last replica out of the route
// at S (it finishes what it was sent); :restart_s=S restarts the proxy at
// S: a new balancer over the same replicas, which reads back the state the
// old one wrote at its shutdown (routing.StateKeeper) unless :inherit=0;
// every proxy of the run restarts then, or with :restart_one=1 only the
// first (a rolling restart's step: its peers keep what they learned).
// The old balancer still hears of the attempts it observed.
type ttftPolicy struct {
	*balancer
	src    *kvSource // nil without KV events
	engine *simEngine
	stream float64
	turns  bool
	scale  *ttftScale // nil without :scale_s, :drain_s or :restart_s
	// rebind connects a new balancer to the proxy's fleet route (nil
	// without sharing), as the proxy does after a reload.
	rebind func(routing.Balancer)
}

// ttftScale is a predicted_ttft policy's reload when the last replica
// joins the route or leaves it, or its proxy's restart (:scale_s,
// :drain_s, :restart_s).
type ttftScale struct {
	at      time.Duration
	inherit bool
	restart bool         // the same replicas, the state read back from its binary form
	spec    routing.Spec // rebuilt over the targets after at
	// before and after are the route's targets (replicas 0 to n-1) before
	// and after the reload.
	before, after int
	done          bool
	// owner is the balancer that observed each attempt in flight.
	owner map[*Flight]routing.Balancer
}

// ttftOptions are predicted_ttft's simulator options (see ttftPolicy).
type ttftOptions struct {
	events, engine, turns bool
	stream                float64
	scaleAt               time.Duration // 0: the route never changes
	drain                 bool          // at scaleAt the last replica leaves rather than joins
	restart               bool          // at scaleAt the proxy restarts (the same replicas)
	restartOne            bool          // only the first proxy restarts
	inherit               bool
}

// simEngine is routing.EngineState over the View of the current pick: the
// engines as last scraped.
type simEngine struct {
	waiting, running []int
	age              time.Duration // since the scrape
	capacity         int
}

func (e *simEngine) Counts(i int) (waiting, running int, age time.Duration, ok bool) {
	if i < 0 || i >= len(e.waiting) || i >= len(e.running) {
		return 0, 0, 0, false
	}
	return e.waiting[i], e.running[i], e.age, true
}

func (e *simEngine) KVCapacityTokens(int) int { return e.capacity }

func newTTFTPolicy(spec routing.Spec, env Env, o ttftOptions) (Policy, error) {
	p := &ttftPolicy{stream: o.stream, turns: o.turns}
	if o.events {
		p.src = &kvSource{reps: make([]kvindex.Residency, env.Replicas), now: env.Now, memo: identities{bs: env.BlockSize}}
		spec.KV = p.src
	}
	if o.engine {
		p.engine = &simEngine{capacity: env.CapacityBlocks * env.BlockSize}
		spec.Engine = p.engine
	}
	n := env.Replicas
	if o.restart && o.restartOne && env.Proxy != 0 {
		o.scaleAt = 0 // this proxy never restarts
	}
	if o.scaleAt > 0 {
		if env.Replicas < 2 && !o.restart {
			return nil, fmt.Errorf("scale_s and drain_s need 2 replicas or more")
		}
		sc := &ttftScale{at: o.scaleAt, inherit: o.inherit, restart: o.restart, spec: spec, before: n - 1, after: n, owner: map[*Flight]routing.Balancer{}}
		switch {
		case o.drain:
			sc.before, sc.after = n, n-1
		case o.restart:
			sc.before = n
		}
		sc.spec.Weights = spec.Weights[:sc.after]
		p.scale = sc
		n = sc.before
		spec.Weights = spec.Weights[:n]
	}
	b, err := routing.New(spec)
	if err != nil {
		return nil, err
	}
	p.balancer = &balancer{b: b, all: routing.All(n)}
	return p, nil
}

// scaled reloads the route once the last replica has joined or left it,
// or restarts the proxy (:scale_s, :drain_s, :restart_s).
func (p *ttftPolicy) scaled(v *View) {
	s := p.scale
	if s == nil || s.done || v.Now < s.at {
		return
	}
	s.done = true
	b, err := routing.New(s.spec)
	if err != nil {
		panic(err) // the spec built the first balancer, with one target more or less
	}
	from := make([]int, s.after)
	for i := range from {
		from[i] = i
		if i >= s.before {
			from[i] = -1
		}
	}
	if s.restart && s.inherit {
		state, err := p.b.(routing.StateKeeper).AppendState(nil)
		if err == nil {
			err = b.(routing.StateKeeper).RestoreState(state, from)
		}
		if err != nil {
			panic(err) // a balancer's own state
		}
	} else if in, ok := b.(routing.Inheritor); ok && s.inherit {
		in.Inherit(p.b, from)
	}
	p.balancer = &balancer{b: b, all: routing.All(s.after)}
	if p.rebind != nil {
		p.rebind(b)
	}
}

// loads is v's loads over the route's targets.
func (p *ttftPolicy) loads(v *View) []int {
	if n := p.all.Len(); len(v.Loads) > n {
		return v.Loads[:n]
	}
	return v.Loads
}

// owner is the balancer that observed f.
func (p *ttftPolicy) owner(f *Flight) routing.Balancer {
	if p.scale != nil {
		if b, ok := p.scale.owner[f]; ok {
			return b
		}
	}
	return p.b
}

func (p *ttftPolicy) sync(v *View) {
	if p.src != nil {
		p.src.memo.forget()
	}
	if p.engine != nil {
		p.engine.waiting, p.engine.running, p.engine.age = v.ScrapedWaiting, v.ScrapedRunning, v.Now-v.ScrapedAt
	}
}

// scrapeInterval implements metricsScraper: with the engines' state, the
// proxy reads their counts as its [providers.engine_load] scrape last saw
// them, every interval_ms at its default, not as they are now.
func (p *ttftPolicy) scrapeInterval() time.Duration {
	if p.engine == nil {
		return 0
	}
	return config.DefaultEngineLoadIntervalMS * time.Millisecond
}

func (p *ttftPolicy) Pick(f *Flight, v *View) int {
	p.scaled(v)
	p.sync(v)
	p.buffered(f)
	return p.b.Pick(&f.Ctx, p.loads(v), p.all)
}

// buffered marks f's answer as not streamed, for the share of sessions
// that do not stream (:stream=P).
func (p *ttftPolicy) buffered(f *Flight) {
	f.Ctx.Buffered = p.stream < 1 && float64(Key(kindStream, uint64(f.sess.s.ID))>>11)/(1<<53) >= p.stream
}

// Defer is the wait for f's turn in a burst, as the proxy asks it before
// the first pick (routing.Deferrer); 0 with :turns=0.
func (p *ttftPolicy) Defer(f *Flight, v *View) time.Duration {
	d, ok := p.b.(routing.Deferrer)
	if !ok || !p.turns {
		return 0
	}
	p.scaled(v)
	p.sync(v)
	p.buffered(f)
	return d.Defer(&f.Ctx, p.loads(v), p.all)
}

func (p *ttftPolicy) Observe(target int, f *Flight, v *View) {
	p.sync(v)
	if p.scale != nil {
		p.scale.owner[f] = p.b
	}
	p.balancer.Observe(target, f, v)
}

func (p *ttftPolicy) FirstToken(f *Flight, now time.Duration) {
	if f.Ctx.Buffered {
		return
	}
	if o, ok := p.owner(f).(routing.TTFTObserver); ok {
		o.FirstToken(f.Target, &f.Ctx, now-f.Issued, len(f.Req.Tokens()))
	}
}

// Done tells a non-streaming answer whole, then its completion, as the
// proxy does when the JSON body arrives.
func (p *ttftPolicy) Done(f *Flight, now time.Duration) {
	b := p.owner(f)
	if o, ok := b.(routing.TTFTObserver); ok && f.Ctx.Buffered {
		o.WholeAnswer(f.Target, &f.Ctx, now-f.Issued, len(f.Req.Tokens()), f.Req.Output)
	}
	learn(b, f, now)
	if p.scale != nil {
		delete(p.scale.owner, f)
	}
}

func (p *ttftPolicy) applyKV(replica int, ops []kvdelta.Op) {
	if p.src != nil {
		p.src.reps[replica].Apply(ops)
	}
}
