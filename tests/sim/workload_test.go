package sim

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"rolter.dev/tests/vllmsim"
)

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func hdr(role string) int { return len(vllmsim.Tokenize("<|" + role + "|>")) }

// allRequests lists every turn of a workload as a request.
func allRequests(w *Workload) []*Request {
	var out []*Request
	for _, s := range w.Sessions {
		for i, t := range s.Turns {
			out = append(out, &Request{Session: s, Turn: i, Messages: t.Messages, Output: t.Output})
		}
	}
	return out
}

func smallWorkloads() map[string]*Workload {
	return map[string]*Workload{
		"gsp":       GSP(GSPParams{Groups: 3, PromptsPerGroup: 3, SystemLen: 300, QuestionLen: 20, OutputLen: 5, Concurrency: 4}, 7),
		"multiturn": Multiturn(MultiturnParams{Clients: 3, Rounds: 3, RequestLen: 40, OutputLen: 10, SystemLen: 30, Concurrency: 2, Spread: 0.5}, 7),
		"agent": Agent(AgentParams{Agents: 2, Turns: 3, SystemLen: 200, TaskLen: 20, ToolLen: 9000, ToolSigma: 0.3,
			MaxToolLen: 20000, OutputLen: 8, Concurrency: 2}, 7),
		"unique": Unique(UniqueParams{Requests: 4, PromptLen: 50, OutputLen: 5, Spread: 0.5, Concurrency: 2}, 7),
	}
}

// The simulator's token ids are exactly what a vLLM simulator replica
// computes for the same chat messages, so both hit the same cache blocks.
func TestPromptTokensMatchTheVLLMSimulator(t *testing.T) {
	for name, w := range smallWorkloads() {
		for _, r := range allRequests(w) {
			want := vllmsim.Tokenize(vllmsim.ChatPrompt(VLLMMessages(r.Messages)))
			if got := r.Tokens(); !slices.Equal(got, want) {
				t.Fatalf("%s session %d turn %d: %d tokens, vllmsim computes %d", name, r.Session.ID, r.Turn, len(got), len(want))
			}
		}
	}
}

// Every vocabulary word is one token, so a segment of N words is N tokens.
func TestVocabularyWordsAreOneToken(t *testing.T) {
	for i, w := range vocabulary.words {
		if ids := vllmsim.Tokenize(w); len(ids) != 1 || ids[0] != vocabulary.ids[i] {
			t.Fatalf("word %q tokenizes to %v", w, ids)
		}
	}
}

// The routing context is what pkg/affinity builds from the chat body: the
// first 32 KiB of the "role: content\n" text, its whole length and digest.
func TestRouteContext(t *testing.T) {
	long := &Request{Messages: []Message{
		{Role: "system", Content: []Segment{{Key(1, 2), 100}}},
		{Role: "user", Content: []Segment{{Key(1, 3), 20000}}}, // ~90 KiB
	}}
	short := &Request{Messages: long.Messages[:1], Session: &Session{Key: "s-1"}}
	for _, tc := range []struct {
		name    string
		r       *Request
		session bool
	}{{"long", long, false}, {"short", short, false}, {"session", short, true}} {
		t.Run(tc.name, func(t *testing.T) {
			text := RouteText(tc.r.Messages)
			ctx := RouteContext(tc.r, tc.session)
			if !strings.HasPrefix(text, ctx.Prompt) || len(ctx.Prompt) > MaxPromptBytes || !utf8.ValidString(ctx.Prompt) {
				t.Fatalf("prompt of %d bytes is not a valid prefix of the %d-byte text", len(ctx.Prompt), len(text))
			}
			if len(text) > MaxPromptBytes && len(ctx.Prompt) < MaxPromptBytes-8 {
				t.Fatalf("prompt cut at %d bytes, want close to %d", len(ctx.Prompt), MaxPromptBytes)
			}
			if len(text) <= MaxPromptBytes && ctx.Prompt != text {
				t.Fatal("a short text is not whole")
			}
			if ctx.PromptLen != len(text) || !ctx.HasDigest || ctx.PromptDigest != xxh3.HashString(text) {
				t.Fatalf("len %d digest %#x, want %d %#x", ctx.PromptLen, ctx.PromptDigest, len(text), xxh3.HashString(text))
			}
			if want := map[bool]string{true: "s-1"}[tc.session]; ctx.SessionKey != want {
				t.Fatalf("session key %q, want %q", ctx.SessionKey, want)
			}
		})
	}
	if !strings.HasPrefix(RouteText(short.Messages), "system: ") {
		t.Fatalf("route text %q does not start with the role", RouteText(short.Messages)[:20])
	}
}

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		s     string
		limit int
		want  string
	}{
		{"abc", 5, "abc"}, {"abcdef", 3, "abc"}, {"aé", 2, "a"}, {"aé", 3, "aé"}, {"中中", 4, "中"}, {"😀", 3, ""},
	} {
		if got := cut(tc.s, tc.limit); got != tc.want {
			t.Errorf("cut(%q, %d) = %q, want %q", tc.s, tc.limit, got, tc.want)
		}
	}
}

func TestGSPStructure(t *testing.T) {
	p := GSPParams{Groups: 4, PromptsPerGroup: 5, SystemLen: 256, QuestionLen: 32, OutputLen: 7, Concurrency: 3}
	w := GSP(p, 11)
	if len(w.Sessions) != p.Groups*p.PromptsPerGroup || w.Concurrency != 3 {
		t.Fatalf("%d sessions, concurrency %d", len(w.Sessions), w.Concurrency)
	}
	sys := hdr("system") + p.SystemLen + hdr("user") // tokens every prompt of a group shares
	groupOf := map[*Session]uint64{}
	for _, s := range w.Sessions {
		if len(s.Turns) != 1 || s.Turns[0].Output != p.OutputLen {
			t.Fatalf("session %d: %d turns, output %d", s.ID, len(s.Turns), s.Turns[0].Output)
		}
		m := s.Turns[0].Messages
		if len(m) != 2 || m[0].Tokens() != p.SystemLen || m[1].Tokens() != p.QuestionLen {
			t.Fatalf("session %d: messages %+v", s.ID, m)
		}
		groupOf[s] = m[0].Content[0].Key
	}
	for i, a := range w.Sessions {
		ta := PromptTokens(a.Turns[0].Messages)
		if len(ta) != sys+p.QuestionLen+hdr("assistant") {
			t.Fatalf("prompt of %d tokens", len(ta))
		}
		for _, b := range w.Sessions[i+1:] {
			c := commonPrefix(ta, PromptTokens(b.Turns[0].Messages))
			switch same := groupOf[a] == groupOf[b]; {
			case same && c != sys:
				t.Fatalf("sessions %d and %d of one group share %d tokens, want exactly the system prompt (%d)", a.ID, b.ID, c, sys)
			case !same && c != hdr("system"):
				t.Fatalf("sessions %d and %d of different groups share %d tokens, want the role marker only", a.ID, b.ID, c)
			}
		}
	}
	// Shuffled by default, grouped when ordered.
	ordered := GSP(GSPParams{Groups: 4, PromptsPerGroup: 5, SystemLen: 8, QuestionLen: 2, OutputLen: 1, Ordered: true}, 11)
	for i, s := range ordered.Sessions {
		if want := ordered.Sessions[i/5*5].Turns[0].Messages[0].Content[0].Key; s.Turns[0].Messages[0].Content[0].Key != want {
			t.Fatal("ordered gsp is not grouped")
		}
	}
	if slices.EqualFunc(w.Sessions, GSP(p, 12).Sessions, func(a, b *Session) bool { return a.ID == b.ID }) {
		t.Fatal("two seeds shuffle alike")
	}
}

func TestConversationsExtendTheirPrefix(t *testing.T) {
	for _, name := range []string{"multiturn", "agent"} {
		w := smallWorkloads()[name]
		for _, s := range w.Sessions {
			for k := 1; k < len(s.Turns); k++ {
				prev, next := PromptTokens(s.Turns[k-1].Messages), PromptTokens(s.Turns[k].Messages)
				// The previous prompt ends with the assistant's generation
				// marker, which opens the answer in the next prompt.
				if len(next) <= len(prev) || !slices.Equal(next[:len(prev)], prev) {
					t.Fatalf("%s session %d: turn %d does not extend turn %d", name, s.ID, k, k-1)
				}
				if !strings.HasPrefix(RouteText(s.Turns[k].Messages), RouteText(s.Turns[k-1].Messages)) {
					t.Fatalf("%s session %d: route text of turn %d does not extend turn %d", name, s.ID, k, k-1)
				}
			}
		}
	}
	// Agents share the tool definitions and nothing else.
	w := smallWorkloads()["agent"]
	a, b := PromptTokens(w.Sessions[0].Turns[2].Messages), PromptTokens(w.Sessions[1].Turns[2].Messages)
	if c := commonPrefix(a, b); c != hdr("system")+200+hdr("user") {
		t.Fatalf("agents share %d tokens", c)
	}
	last := w.Sessions[0].Turns[2].Messages
	if last[len(last)-1].Role != "tool" || last[len(last)-1].Tokens() < 1000 {
		t.Fatalf("the last message is not a large tool result: %s of %d tokens", last[len(last)-1].Role, last[len(last)-1].Tokens())
	}
}

// Random think times vary round to round around their mean and leave the
// conversations' text as it was.
func TestMultiturnThinkExp(t *testing.T) {
	p := MultiturnParams{Clients: 50, Rounds: 5, RequestLen: 40, OutputLen: 10, Concurrency: 8, Spread: 0.5, Think: time.Second}
	fixed := Multiturn(p, 3)
	p.ThinkExp = true
	exp := Multiturn(p, 3)
	var sum time.Duration
	n, distinct := 0, map[time.Duration]bool{}
	for c, s := range exp.Sessions {
		for k, turn := range s.Turns {
			if !slices.Equal(PromptTokens(turn.Messages), PromptTokens(fixed.Sessions[c].Turns[k].Messages)) {
				t.Fatalf("session %d turn %d: the text changed with random think times", c, k)
			}
			if fixed.Sessions[c].Turns[k].Think != min(time.Duration(k), 1)*time.Second {
				t.Fatalf("fixed think time %v at turn %d", fixed.Sessions[c].Turns[k].Think, k)
			}
			if k == 0 {
				if turn.Think != 0 {
					t.Fatalf("a first turn thinks %v", turn.Think)
				}
				continue
			}
			sum += turn.Think
			n++
			distinct[turn.Think] = true
		}
	}
	if mean := sum / time.Duration(n); mean < 800*time.Millisecond || mean > 1200*time.Millisecond || len(distinct) < n-1 {
		t.Fatalf("%d random think times: mean %v, %d distinct; want about 1s, all different", n, mean, len(distinct))
	}
}

func TestUniqueSharesNothing(t *testing.T) {
	w := Unique(UniqueParams{Requests: 20, PromptLen: 64, OutputLen: 4, Spread: 0.5}, 3)
	lens := map[int]bool{}
	for i, a := range w.Sessions {
		ta := PromptTokens(a.Turns[0].Messages)
		lens[len(ta)] = true
		for _, b := range w.Sessions[i+1:] {
			if c := commonPrefix(ta, PromptTokens(b.Turns[0].Messages)); c != hdr("user") {
				t.Fatalf("sessions %d and %d share %d tokens", a.ID, b.ID, c)
			}
		}
	}
	if len(lens) < 5 {
		t.Fatalf("lengths do not spread: %v", lens)
	}
	if u := UnboundedHitRate(w, 16); u != 0 {
		t.Fatalf("unbounded hit rate %v, want 0", u)
	}
}

// The unbounded hit rate of gsp: each group computes its system prompt once.
func TestUnboundedHitRateGSP(t *testing.T) {
	p := GSPParams{Groups: 2, PromptsPerGroup: 4, SystemLen: 16*10 - hdr("system"), QuestionLen: 40, OutputLen: 1}
	w := GSP(p, 5)
	prompt := hdr("system") + p.SystemLen + hdr("user") + p.QuestionLen + hdr("assistant")
	// Each group's 2nd..4th prompt hits the 10 blocks holding the system
	// prompt (the block after them holds the user marker and the question).
	want := float64(p.Groups*(p.PromptsPerGroup-1)*160) / float64(p.Groups*p.PromptsPerGroup*prompt)
	if got := UnboundedHitRate(w, 16); got != want {
		t.Fatalf("unbounded hit rate %v, want %v", got, want)
	}
}

// ChatBody and Header are what affinity.Build would read (see RouteContext).
func TestChatBodyAndHeader(t *testing.T) {
	w := smallWorkloads()["agent"]
	r := allRequests(w)[2]
	var body struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Messages  []struct {
			Role, Content string
		} `json:"messages"`
	}
	if err := json.Unmarshal(r.ChatBody(), &body); err != nil {
		t.Fatal(err)
	}
	if body.MaxTokens != r.Output || len(body.Messages) != len(r.Messages) {
		t.Fatalf("body %+v", body)
	}
	var text strings.Builder
	for i, m := range body.Messages {
		if m.Role != r.Messages[i].Role || m.Content != r.Messages[i].Text() {
			t.Fatalf("message %d differs", i)
		}
		text.WriteString(m.Role + ": " + m.Content + "\n")
	}
	if text.String() != RouteText(r.Messages) {
		t.Fatal("the route text is not the body's turns")
	}
	if h := r.Header(true); h.Get("X-Session-Id") != r.Session.Key || r.Session.Key == "" {
		t.Fatalf("header %v", h)
	}
	if h := r.Header(false); len(h) != 0 {
		t.Fatalf("header %v without session keys", h)
	}
}

// RouteContext (pkg/affinity on the chat body) and directContext (built from
// the messages) agree on every field, long prompts and session keys
// included; the peers' text extraction (ContentText, RoleContentText) relies on
// the same rendering.
func TestRouteContextIsAffinitys(t *testing.T) {
	ws := smallWorkloads()
	ws["long"] = &Workload{Sessions: []*Session{{Key: "long-0", Turns: []Turn{{Messages: []Message{
		{Role: "system", Content: []Segment{{Key(1), 100}}},
		{Role: "user", Content: []Segment{{Key(2), 20000}}},
	}}}}}}
	for name, w := range ws {
		for _, r := range allRequests(w) {
			for _, sk := range []bool{false, true} {
				a, b := RouteContext(r, sk), directContext(r, sk)
				if whole := RouteText(r.Messages); len(whole) > MaxPromptBytes && a.PromptChain.Len != len(whole) {
					t.Fatalf("%s: a %d-byte prompt cut to %d carries a chain of %d bytes", name, len(whole), len(a.Prompt), a.PromptChain.Len)
				}
				if a.Prompt != b.Prompt || a.PromptLen != b.PromptLen || a.PromptDigest != b.PromptDigest ||
					a.HasDigest != b.HasDigest || a.SessionKey != b.SessionKey || a.TokenIDs != nil ||
					a.PromptChain.Len != b.PromptChain.Len || !slices.Equal(a.PromptChain.Hashes, b.PromptChain.Hashes) {
					t.Fatalf("%s session %d turn %d: affinity gives len %d digest %#x session %q, direct len %d digest %#x session %q",
						name, r.Session.ID, r.Turn, a.PromptLen, a.PromptDigest, a.SessionKey, b.PromptLen, b.PromptDigest, b.SessionKey)
				}
			}
		}
	}
}

// The peers' views of a request: SGLang and AIBrix read the contents joined
// by spaces, llm-d's estimate token producer each role and its content.
func TestPeerTexts(t *testing.T) {
	msgs := smallWorkloads()["multiturn"].Sessions[0].Turns[2].Messages
	var parts []string
	var packed strings.Builder
	for _, m := range msgs {
		parts = append(parts, m.Text())
		packed.WriteString(m.Role + m.Text())
	}
	want := packed.String()
	if got := RoleContentText(msgs, 0); got != want {
		t.Fatalf("RoleContentText = %.80s..., want %.80s...", got, want)
	}
	if got := RoleContentText(msgs, 100); got != want[:100] {
		t.Fatalf("RoleContentText cut at 100 = %q", got)
	}
	whole := strings.Join(parts, " ")
	if got, n := ContentText(msgs, 0); got != whole || n != len(whole) {
		t.Fatalf("ContentText = %d bytes (len %d), want %d", len(got), n, len(whole))
	}
	if got, n := ContentText(msgs, 50); got != whole[:50] || n != len(whole) {
		t.Fatalf("ContentText cut at 50 = %q (len %d)", got, n)
	}
}
