package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"rolter.dev/tests/vllmsim"
)

// Session is a sequence of requests from one client: turn k+1 is sent only
// after turn k completed (and Think of turn k+1 passed).
type Session struct {
	// ID is the session's index in its workload.
	ID int
	// Key is the session's x-session-id (sent only with Config.SessionKeys).
	Key string
	// Start is the arrival of the first turn in open-loop replay (trace
	// timestamps); negative when the workload has no arrival times.
	Start time.Duration
	// Turns are the session's requests in order.
	Turns []Turn
}

// Turn is one request of a session.
type Turn struct {
	// Messages is the whole conversation sent with this request.
	Messages []Message
	// Output is the number of tokens the replica generates.
	Output int
	// Think is the client's delay between the previous turn's completion
	// and this turn (0 for the first turn).
	Think time.Duration
}

// Workload is a seeded, fully materialised set of sessions.
type Workload struct {
	// Name is the workload's name (gsp, multiturn, agent, unique, trace).
	Name string
	// Sessions in the order clients pick them up.
	Sessions []*Session
	// Concurrency is the default number of closed-loop clients; 0 means open
	// loop on Session.Start.
	Concurrency int
}

// Requests is the total number of requests of the workload.
func (w *Workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

func sessionKey(workload string, id int) string { return fmt.Sprintf("%s-%d", workload, id) }

// GSPParams parametrise SGLang's generated-shared-prefix benchmark
// (bench_serving --dataset-name generated-shared-prefix).
type GSPParams struct {
	Groups          int  // --gsp-num-groups (64)
	PromptsPerGroup int  // --gsp-prompts-per-group (16)
	SystemLen       int  // --gsp-system-prompt-len (2048)
	QuestionLen     int  // --gsp-question-len (128)
	OutputLen       int  // --gsp-output-len (256)
	Ordered         bool // --gsp-ordered (false: shuffled)
	Concurrency     int  // closed-loop clients (128)
}

// DefaultGSP returns SGLang's defaults.
func DefaultGSP() GSPParams {
	return GSPParams{Groups: 64, PromptsPerGroup: 16, SystemLen: 2048, QuestionLen: 128, OutputLen: 256, Concurrency: 128}
}

// GSP builds the generated-shared-prefix workload: every prompt is its
// group's system prompt followed by its own question; the requests are
// shuffled unless Ordered.
func GSP(p GSPParams, seed uint64) *Workload {
	w := &Workload{Name: "gsp", Concurrency: p.Concurrency}
	for g := range p.Groups {
		sys := Segment{Key(seed, kindGSPSystem, uint64(g)), p.SystemLen}
		for q := range p.PromptsPerGroup {
			id := len(w.Sessions)
			w.Sessions = append(w.Sessions, &Session{
				ID: id, Key: sessionKey("gsp", id), Start: -1,
				Turns: []Turn{{
					Messages: []Message{
						{Role: "system", Content: []Segment{sys}},
						{Role: "user", Content: []Segment{{Key(seed, kindGSPQuestion, uint64(g), uint64(q)), p.QuestionLen}}},
					},
					Output: p.OutputLen,
				}},
			})
		}
	}
	if !p.Ordered {
		rng := rand.New(rand.NewPCG(seed, kindGSPSystem))
		rng.Shuffle(len(w.Sessions), func(i, j int) { w.Sessions[i], w.Sessions[j] = w.Sessions[j], w.Sessions[i] })
	}
	return w
}

// MultiturnParams parametrise conversations that grow turn by turn (SGLang
// benchmark/hicache/bench_multiturn.py).
type MultiturnParams struct {
	Clients     int // --num-clients (256): conversations
	Rounds      int // --num-rounds (5)
	RequestLen  int // --request-length (512): new user tokens per round
	OutputLen   int // --output-length (64)
	SystemLen   int // a system prompt shared by every conversation (0: none)
	Concurrency int // --max-parallel (128)
	Think       time.Duration
	// ThinkExp draws each round's think time from an exponential
	// distribution of mean Think instead of Think itself, so that
	// conversations come back in a random order rather than the order
	// they left (people answer after varying delays).
	ThinkExp bool
	// Spread draws each request and answer length uniformly from
	// [mean*(1-Spread), mean*(1+Spread)] (0.5), as a real dataset's
	// lengths vary; 0 gives bench_multiturn's fixed random-token lengths,
	// whose lockstep lets round robin return every conversation to the same
	// replica when the client count divides evenly.
	Spread float64
}

// DefaultMultiturn returns bench_multiturn's defaults, with lengths spread
// ±50 %.
func DefaultMultiturn() MultiturnParams {
	return MultiturnParams{Clients: 256, Rounds: 5, RequestLen: 512, OutputLen: 64, Concurrency: 128, Spread: 0.5}
}

// spreadLen draws a length around mean (see MultiturnParams.Spread).
func spreadLen(rng *rand.Rand, mean int, spread float64) int {
	if spread <= 0 {
		return mean
	}
	return max(1, int(float64(mean)*(1-spread+2*spread*rng.Float64())))
}

// Multiturn builds the multi-turn workload: each round sends the whole
// history plus a new user message; the answer joins the history. Clients
// take ready conversations first in, first out, so a conversation's next
// round queues behind the other conversations' rounds, as in bench_multiturn.
func Multiturn(p MultiturnParams, seed uint64) *Workload {
	w := &Workload{Name: "multiturn", Concurrency: p.Concurrency}
	rng := rand.New(rand.NewPCG(seed, kindMTUser))
	// A stream of its own, so that the lengths do not change with ThinkExp.
	think := rand.New(rand.NewPCG(seed, kindMTThink))
	var sys []Message
	if p.SystemLen > 0 {
		sys = []Message{{Role: "system", Content: []Segment{{Key(seed, kindMTSystem), p.SystemLen}}}}
	}
	for c := range p.Clients {
		s := &Session{ID: c, Key: sessionKey("multiturn", c), Start: -1}
		hist := slices.Clip(sys)
		for r := range p.Rounds {
			msgs := append(slices.Clip(hist), Message{Role: "user", Content: []Segment{{Key(seed, kindMTUser, uint64(c), uint64(r)), spreadLen(rng, p.RequestLen, p.Spread)}}})
			out := spreadLen(rng, p.OutputLen, p.Spread)
			t := Turn{Messages: msgs, Output: out}
			if r > 0 {
				t.Think = p.Think
				if p.ThinkExp {
					t.Think = time.Duration(think.ExpFloat64() * float64(p.Think))
				}
			}
			s.Turns = append(s.Turns, t)
			hist = append(slices.Clip(msgs), Message{Role: "assistant", Content: []Segment{{Key(seed, kindMTAnswer, uint64(c), uint64(r)), out}}})
		}
		w.Sessions = append(w.Sessions, s)
	}
	return w
}

// AgentParams parametrise tool-heavy agent sessions: a long shared system
// prompt (tool definitions), a task, then turns of a short tool call by the
// model followed by a large tool result.
type AgentParams struct {
	Agents      int           // sessions (64)
	Turns       int           // model calls per session (8)
	SystemLen   int           // shared system prompt with tool definitions (4096)
	TaskLen     int           // per-agent task (256)
	ToolLen     int           // mean tool result, lognormal (2048)
	ToolSigma   float64       // lognormal sigma of tool results (0.8)
	MaxToolLen  int           // cap of a tool result (16384)
	OutputLen   int           // tokens per model call (the tool call) (64)
	ToolTime    time.Duration // tool execution between turns (500 ms)
	Concurrency int           // closed-loop clients (64)
}

// DefaultAgent returns the agent workload's defaults.
func DefaultAgent() AgentParams {
	return AgentParams{Agents: 64, Turns: 8, SystemLen: 4096, TaskLen: 256, ToolLen: 2048, ToolSigma: 0.8,
		MaxToolLen: 16384, OutputLen: 64, ToolTime: 500 * time.Millisecond, Concurrency: 64}
}

// Agent builds the agent workload.
func Agent(p AgentParams, seed uint64) *Workload {
	w := &Workload{Name: "agent", Concurrency: p.Concurrency}
	rng := rand.New(rand.NewPCG(seed, kindAgentResult))
	sys := Message{Role: "system", Content: []Segment{{Key(seed, kindAgentSystem), p.SystemLen}}}
	mu := math.Log(float64(max(p.ToolLen, 1))) - p.ToolSigma*p.ToolSigma/2 // lognormal with mean ToolLen
	for a := range p.Agents {
		s := &Session{ID: a, Key: sessionKey("agent", a), Start: -1}
		hist := []Message{sys, {Role: "user", Content: []Segment{{Key(seed, kindAgentTask, uint64(a)), p.TaskLen}}}}
		for t := range p.Turns {
			turn := Turn{Messages: slices.Clip(hist), Output: p.OutputLen}
			if t > 0 {
				turn.Think = p.ToolTime
			}
			s.Turns = append(s.Turns, turn)
			res := int(math.Exp(mu + p.ToolSigma*rng.NormFloat64()))
			res = min(max(res, 16), max(p.MaxToolLen, 16))
			hist = append(slices.Clip(hist),
				Message{Role: "assistant", Content: []Segment{{Key(seed, kindAgentCall, uint64(a), uint64(t)), p.OutputLen}}},
				Message{Role: "tool", Content: []Segment{{Key(seed, kindAgentResult, uint64(a), uint64(t)), res}}})
		}
		w.Sessions = append(w.Sessions, s)
	}
	return w
}

// UniqueParams parametrise prompts that share nothing (beyond the chat
// template's role markers).
type UniqueParams struct {
	Requests  int // (1024)
	PromptLen int // mean prompt tokens (2176, a gsp prompt's length)
	OutputLen int // mean output tokens (256)
	// Spread draws each length uniformly from [mean*(1-Spread),
	// mean*(1+Spread)] (0.5); 0 makes every request the same size.
	Spread      float64
	Concurrency int // (128)
}

// DefaultUnique returns the unique workload's defaults.
func DefaultUnique() UniqueParams {
	return UniqueParams{Requests: 1024, PromptLen: 2176, OutputLen: 256, Spread: 0.5, Concurrency: 128}
}

// Unique builds the workload without shared prefixes.
func Unique(p UniqueParams, seed uint64) *Workload {
	w := &Workload{Name: "unique", Concurrency: p.Concurrency}
	rng := rand.New(rand.NewPCG(seed, kindUnique))
	spread := func(mean int) int { return spreadLen(rng, mean, p.Spread) }
	for i := range p.Requests {
		w.Sessions = append(w.Sessions, &Session{
			ID: i, Key: sessionKey("unique", i), Start: -1,
			Turns: []Turn{{
				Messages: []Message{{Role: "user", Content: []Segment{{Key(seed, kindUnique, uint64(i)), spread(p.PromptLen)}}}},
				Output:   spread(p.OutputLen),
			}},
		})
	}
	return w
}

// UnboundedHitRate is the token-level prefix-cache hit rate of the workload
// on one cache of unbounded capacity with the given block size: the best any
// routing can do. It uses the vLLM simulator's rules (chained block hashes;
// the last prompt token is always computed). With nothing ever evicted the
// total does not depend on the order of the requests, only on each session's
// turns coming in order.
func UnboundedHitRate(w *Workload, blockSize int) float64 {
	seen := make(map[uint64]struct{})
	var prompt, hit int64
	for _, s := range w.Sessions {
		for _, t := range s.Turns {
			toks := PromptTokens(t.Messages)
			hashes := vllmsim.BlockHashes(toks, blockSize)
			eligible := 0
			if len(toks) > 0 {
				eligible = (len(toks) - 1) / blockSize
			}
			k := 0
			for k < eligible {
				if _, ok := seen[hashes[k]]; !ok {
					break
				}
				k++
			}
			for _, h := range hashes {
				seen[h] = struct{}{}
			}
			prompt += int64(len(toks))
			hit += int64(k * blockSize)
		}
	}
	if prompt == 0 {
		return 0
	}
	return float64(hit) / float64(prompt)
}
