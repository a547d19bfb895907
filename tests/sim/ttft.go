package sim

import (
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
// no turn in a burst (routing.Deferrer).
type ttftPolicy struct {
	*balancer
	src    *kvSource // nil without KV events
	engine *simEngine
	stream float64
	turns  bool
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

func newTTFTPolicy(spec routing.Spec, env Env, events, engine bool, stream float64, turns bool) (Policy, error) {
	p := &ttftPolicy{stream: stream, turns: turns}
	if events {
		p.src = &kvSource{reps: make([]kvindex.Residency, env.Replicas), now: env.Now, memo: identities{bs: env.BlockSize}}
		spec.KV = p.src
	}
	if engine {
		p.engine = &simEngine{capacity: env.CapacityBlocks * env.BlockSize}
		spec.Engine = p.engine
	}
	b, err := routing.New(spec)
	if err != nil {
		return nil, err
	}
	p.balancer = &balancer{b: b, all: routing.All(env.Replicas)}
	return p, nil
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
	p.sync(v)
	p.buffered(f)
	return p.balancer.Pick(f, v)
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
	p.sync(v)
	p.buffered(f)
	return d.Defer(&f.Ctx, v.Loads, p.all)
}

func (p *ttftPolicy) Observe(target int, f *Flight, v *View) {
	p.sync(v)
	p.balancer.Observe(target, f, v)
}

func (p *ttftPolicy) FirstToken(f *Flight, now time.Duration) {
	if f.Ctx.Buffered {
		return
	}
	if o, ok := p.b.(routing.TTFTObserver); ok {
		o.FirstToken(f.Target, &f.Ctx, now-f.Issued, len(f.Req.Tokens()))
	}
}

// Done tells a non-streaming answer whole, then its completion, as the
// proxy does when the JSON body arrives.
func (p *ttftPolicy) Done(f *Flight, now time.Duration) {
	if o, ok := p.b.(routing.TTFTObserver); ok && f.Ctx.Buffered {
		o.WholeAnswer(f.Target, &f.Ctx, now-f.Issued, len(f.Req.Tokens()), f.Req.Output)
	}
	p.balancer.Done(f, now)
}

func (p *ttftPolicy) applyKV(replica int, ops []kvdelta.Op) {
	if p.src != nil {
		p.src.reps[replica].Apply(ops)
	}
}
