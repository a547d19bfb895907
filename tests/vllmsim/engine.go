package vllmsim

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// plan is a validated generation request, common to every dialect.
type plan struct {
	endpoint string   // request path, for the per-endpoint counter
	model    string   // served name the request asked for
	prompt   []uint32 // prompt token ids
	outLen   int      // output tokens to generate
	length   bool     // true when outLen is a limit the output hits ("length")
	salt     string   // the request's cache_salt, "" for none
	sampling sampling // choices, stop strings and tokens, logprobs
}

// prepare validates a generation request's model and output length,
// counts it and draws the fail rate. maxTokens is the request's own limit,
// nil when it set none; salt is its cache_salt, "" for none.
func (s *Server) prepare(endpoint, model string, prompt []uint32, maxTokens *int, salt string) (plan, *apiError) {
	return s.prepareSampled(endpoint, model, prompt, maxTokens, salt, oneChoice)
}

// prepareSampled is prepare for a request with sampling fields, checked
// as vLLM checks them: after the model and the context window, before the
// request reaches the engine.
//
// The output runs to max_tokens (finish reason "length") or, without one,
// to the simulated EOS after MaxTokensDefault tokens, or min_tokens if more
// (finish reason "stop"). With ignore_eos and no max_tokens it runs to
// vLLM's own limit: the rest of the context window for chat, 16 tokens for
// completions (finish reason "length").
func (s *Server) prepareSampled(endpoint, model string, prompt []uint32, maxTokens *int, salt string, sp sampling) (plan, *apiError) {
	served, ok := s.servedModel(model)
	if !ok {
		return plan{}, errorf(http.StatusNotFound, "The model `%s` does not exist.", model)
	}
	p := plan{endpoint: endpoint, model: served, prompt: prompt, salt: salt, sampling: sp}
	limit := s.opts.MaxModelLen
	// vLLM's max_tokens when the request sets none (get_max_tokens).
	vllmMax := limit - len(prompt)
	if sp.defaultMax > 0 {
		vllmMax = sp.defaultMax
	}
	switch {
	case maxTokens != nil && *maxTokens < 1:
		return plan{}, errorf(http.StatusBadRequest, "max_tokens must be at least 1, got %d.", *maxTokens)
	case maxTokens != nil:
		p.outLen, p.length = *maxTokens, true
		vllmMax = *maxTokens
	case sp.ignoreEOS:
		p.outLen, p.length = vllmMax, true
	default:
		eos := sp.eos(s.opts.MaxTokensDefault)
		p.outLen = min(eos, limit-len(prompt))
		p.length = p.outLen < eos
	}
	if len(prompt)+max(p.outLen, 1) > limit {
		return plan{}, errorf(http.StatusBadRequest,
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			limit, len(prompt)+p.outLen, len(prompt), p.outLen)
	}
	if aerr := sp.check(vllmMax, s.opts.MaxLogprobs); aerr != nil {
		return plan{}, aerr
	}
	if aerr := sp.fits(p.outLen, len(prompt)); aerr != nil {
		return plan{}, aerr
	}
	if s.accept(endpoint) {
		return plan{}, errInjected
	}
	return p, nil
}

// generation is one request between admission and its end. It is used by
// one goroutine: the request's handler, or a background response's own
// goroutine (runBackground).
//
// Its choices (the request's n, one for the dialects without n) share the
// prompt, prefilled once, and decode together: each engine step produces
// the next token of every choice not yet done, so the decode takes as many
// steps as the longest choice has tokens, and the other n-1 choices slow
// every step as requests running beside it do (Options.StepGrowth).
type generation struct {
	s       *Server
	p       plan
	cached  int         // prompt tokens served from the prefix cache
	lease   *Lease      // prompt blocks held while running
	seqs    []*sequence // the choices, by index
	emitted int         // tokens produced so far, over all choices
	steps   int         // engine steps run so far
	closed  bool
}

// text is the first choice's output produced so far.
func (g *generation) text() string { return g.seqs[0].sofar() }

// sequences returns the plan's choices, each cut by its stop strings.
func (p plan) sequences() []*sequence {
	seqs := make([]*sequence, p.sampling.n)
	for i := range seqs {
		seqs[i] = newSequence(i, generateChoice(p.prompt, i, p.outLen), p.length, p.sampling)
	}
	return seqs
}

// siblings is what the other choices of a request add to each of its
// engine steps.
func (g *generation) siblings() time.Duration {
	return time.Duration(len(g.seqs)-1) * g.s.opts.StepGrowth
}

// itl is the duration of one decode step.
func (g *generation) itl() time.Duration { return g.s.opts.ITL + g.s.beside() + g.siblings() }

// maxSteps is the decode steps of the whole generation: its longest choice.
func (g *generation) maxSteps() int {
	n := 0
	for _, q := range g.seqs {
		n = max(n, len(q.pieces))
	}
	return n
}

// start queues the request behind MaxNumSeqs, admits it to the prefix cache
// and waits out the time to first token. The caller must call close on the
// returned generation. On error (the context ended) nothing is left to close.
func (s *Server) start(ctx context.Context, p plan) (*generation, error) {
	if s.slots != nil {
		s.waiting.Add(1)
		select {
		case s.slots <- struct{}{}:
			s.waiting.Add(-1)
		case <-ctx.Done():
			s.waiting.Add(-1)
			s.mu.Lock()
			s.stats.cancelled++
			s.stats.finished["abort"]++
			s.mu.Unlock()
			return nil, fmt.Errorf("wait for a slot: %w", ctx.Err())
		}
	}
	s.running.Add(1)
	cached, lease := s.cache.admit(p.prompt, p.salt, p.sampling.promptLogprobs == nil)
	s.mu.Lock()
	s.stats.promptTokens += uint64(len(p.prompt))
	s.stats.cachedTokens += uint64(cached)
	s.mu.Unlock()
	s.logger.LogAttrs(ctx, slog.LevelDebug, "admitted",
		slog.String("endpoint", p.endpoint), slog.String("model", p.model),
		slog.Int("prompt_tokens", len(p.prompt)), slog.Int("cached_tokens", cached),
		slog.Int("max_tokens", p.outLen))
	g := &generation{s: s, p: p, cached: cached, lease: lease, seqs: p.sequences()}
	if err := sleep(ctx, s.ttft(len(p.prompt)-cached)+s.beside()+g.siblings()); err != nil {
		g.close(err)
		return nil, fmt.Errorf("prefill: %w", err)
	}
	return g, nil
}

// beside is what the requests running beside one add to each of its
// engine steps (Options.StepGrowth).
func (s *Server) beside() time.Duration {
	return time.Duration(max(s.running.Load()-1, 0)) * s.opts.StepGrowth
}

// ttft is the time to first token of a request with uncached prompt tokens.
func (s *Server) ttft(uncached int) time.Duration {
	d := s.opts.TTFT
	if tps := s.opts.PrefillTokensPerSecond; tps > 0 && uncached > 0 {
		d += time.Duration(float64(uncached) / tps * float64(time.Second))
	}
	return d
}

// next produces the first choice's next output token and returns the text
// it adds, waiting the inter-token latency before every token but the
// first. ok is false when the output is complete. It serves the dialects
// of one choice.
func (g *generation) next(ctx context.Context) (piece string, ok bool, err error) {
	moved, err := g.step(ctx)
	if len(moved) == 0 || err != nil {
		return "", false, err
	}
	return g.seqs[0].delta(), true, nil
}

// step runs one engine step: every choice not yet done produces its next
// token. It waits the inter-token latency before every step but the first
// and returns the choices that moved, none once all are done.
func (g *generation) step(ctx context.Context) ([]*sequence, error) {
	if g.steps == g.maxSteps() {
		return nil, nil
	}
	if g.steps > 0 {
		if err := sleep(ctx, g.itl()); err != nil {
			return nil, err
		}
	}
	g.steps++
	var moved []*sequence
	for _, q := range g.seqs {
		if q.advance() {
			moved = append(moved, q)
		}
	}
	g.count(len(moved))
	return moved, nil
}

// drain produces the rest of the output at once, waiting the inter-token
// latency of all of it in one sleep (for non-streaming responses).
func (g *generation) drain(ctx context.Context) error {
	rest := g.maxSteps() - g.steps
	if rest == 0 {
		return nil
	}
	wait := rest
	if g.steps == 0 {
		wait-- // the first token comes at the time to first token
	}
	if err := sleep(ctx, time.Duration(wait)*g.itl()); err != nil {
		return err
	}
	g.steps += rest
	tokens := 0
	for _, q := range g.seqs {
		for q.advance() {
			tokens++
		}
	}
	g.count(tokens)
	return nil
}

// count adds produced tokens to the generation's and the server's counts.
func (g *generation) count(tokens int) {
	g.emitted += tokens
	g.s.mu.Lock()
	g.s.stats.genTokens += uint64(tokens)
	g.s.mu.Unlock()
}

// close ends the generation: it caches the output blocks when configured,
// releases the prompt blocks and the slot, and counts the outcome (err nil
// for a completed generation). Calling it again is a no-op.
//
// Of several choices only the first's output blocks are cached (a lease
// extends along one sequence). The finish reasons count each choice, as
// vLLM counts each sequence of a request in vllm:request_success_total;
// Completed and Cancelled count the request.
func (g *generation) close(err error) {
	if g.closed {
		return
	}
	g.closed = true
	s := g.s
	if first := g.seqs[0]; err == nil && s.opts.CacheOutput && first.emitted > 0 {
		seq := append(append([]uint32(nil), g.p.prompt...), Tokenize(strings.Join(first.pieces[:first.emitted], ""))...)
		s.cache.Extend(g.lease, seq)
	}
	s.cache.Release(g.lease)
	s.mu.Lock()
	if err != nil {
		s.stats.cancelled++
		s.stats.finished["abort"] += uint64(len(g.seqs))
	} else {
		s.stats.completed++
		for _, q := range g.seqs {
			s.stats.finished[q.finish]++
		}
	}
	s.mu.Unlock()
	// The gauge drops once the outcome is counted, so that whoever sees the
	// generation gone from Running also sees how it ended.
	s.running.Add(-1)
	if s.slots != nil {
		<-s.slots
	}
}

// sleep waits for d or until ctx ends, whichever comes first, and returns
// ctx's error in the second case.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newID returns prefix followed by 32 random hex digits, the shape of
// vLLM's request ids.
func newID(prefix string) string {
	var b [16]byte
	for i := range 2 {
		v := rand.Uint64()
		for j := range 8 {
			b[i*8+j] = byte(v >> (8 * j))
		}
	}
	return prefix + hex.EncodeToString(b[:])
}

// sseWriter writes a server-sent event stream, flushing every event. After
// the first write error (the client went away) every write is a no-op that
// returns that error.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

// startSSE sends the 200 header of an event stream.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	s.flush()
	return s
}

func (s *sseWriter) flush() {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) && s.err == nil {
		s.err = err
	}
}

// write sends one event; name may be empty for a data-only event.
func (s *sseWriter) write(name string, v any) error {
	if s.err != nil {
		return s.err
	}
	data, err := json.Marshal(v)
	if err != nil {
		s.err = fmt.Errorf("encode event: %w", err)
		return s.err
	}
	var b strings.Builder
	if name != "" {
		b.WriteString("event: ")
		b.WriteString(name)
		b.WriteString("\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	return s.raw(b.String())
}

// raw sends pre-formatted event text.
func (s *sseWriter) raw(text string) error {
	if s.err != nil {
		return s.err
	}
	if _, err := io.WriteString(s.w, text); err != nil {
		s.err = err
		return err
	}
	s.flush()
	return s.err
}
