package tokenize_test

import (
	"net/http"
	"testing"
	"time"

	"rolter.dev/dataplane/internal/tokenize"
)

// TestTrust: an endpoint whose ids are proven wrong TrustMismatches times,
// more often than right, is distrusted for DistrustFirst, then checked
// afresh; a distrust that follows another without a trusted window between
// them lasts twice as long, up to DistrustMax; a trusted window starts the
// next one short again. Other models and endpoints are not touched.
func TestTrust(t *testing.T) {
	c := tokenize.New(http.DefaultClient)
	now := time.Unix(1000, 0)
	const chat, responses = "/v1/chat/completions", "/v1/responses"
	// check records n checks of one result and returns the distrust the
	// last one started.
	check := func(n int, match bool) time.Duration {
		var d time.Duration
		for range n {
			d, _ = c.Check("m", responses, 0, match, now)
		}
		return d
	}

	// A minority of wrong ids never distrusts: one in three, a window long
	// (tokenize.TrustWindow is 32: ten times two right and one wrong, then
	// two right).
	for range 10 {
		check(2, true)
		if d := check(1, false); d != 0 {
			t.Fatalf("one mismatch in three distrusted the endpoint for %v", d)
		}
	}
	check(2, true)
	if c.Distrusted("m", responses, 0, now) {
		t.Fatal("distrusted with the matches in the majority")
	}

	// That window closed trusted, so the next starts afresh: its ten
	// mismatches do not count.
	if d := check(tokenize.TrustMismatches-1, false); d != 0 || c.Distrusted("m", responses, 0, now) {
		t.Fatalf("%d mismatches distrusted the endpoint (%v)", tokenize.TrustMismatches-1, d)
	}
	if d := check(1, false); d != tokenize.DistrustFirst {
		t.Fatalf("the %dth mismatch in a row started a distrust of %v, want %v", tokenize.TrustMismatches, d, tokenize.DistrustFirst)
	}
	if !c.Distrusted("m", responses, 0, now) || !c.Distrusted("m", responses, 0, now.Add(tokenize.DistrustFirst-time.Nanosecond)) {
		t.Fatal("not distrusted during the distrust")
	}
	if c.Distrusted("m", chat, 0, now) || c.Distrusted("other", responses, 0, now) {
		t.Fatal("another endpoint or model distrusted too")
	}
	// Checks arriving during the distrust (requests routed before it) are
	// not counted.
	if d := check(3*tokenize.TrustMismatches, false); d != 0 {
		t.Fatalf("checks during a distrust started another: %v", d)
	}

	// Wrong again once it ends: twice as long, and so on up to the bound.
	want := tokenize.DistrustFirst
	for range 8 {
		now = now.Add(want)
		if c.Distrusted("m", responses, 0, now) {
			t.Fatalf("still distrusted after %v", want)
		}
		want = min(2*want, tokenize.DistrustMax)
		if d := check(tokenize.TrustMismatches, false); d != want {
			t.Fatalf("distrust of %v, want %v", d, want)
		}
	}

	// Right once it ends: a trusted window, and the next distrust is short.
	now = now.Add(want)
	check(tokenize.TrustWindow, true)
	if d := check(tokenize.TrustMismatches, false); d != tokenize.DistrustFirst {
		t.Fatalf("a distrust after a trusted window lasts %v, want %v", d, tokenize.DistrustFirst)
	}
}

// TestTrustByShape: requests of one shape whose ids are always wrong,
// among a majority of right ones, are distrusted alone after
// TrustMismatches of their own; the endpoint's other shapes keep their
// ids.
func TestTrustByShape(t *testing.T) {
	c := tokenize.New(http.DefaultClient)
	now := time.Unix(1000, 0)
	const chat = "/v1/chat/completions"
	tools := tokenize.ShapeTools | tokenize.ShapeToolTurns
	for i := range tokenize.TrustMismatches {
		for range 3 {
			if d, _ := c.Check("m", chat, 0, true, now); d != 0 {
				t.Fatal("right ids distrusted")
			}
		}
		d, shapeOnly := c.Check("m", chat, tools, false, now)
		if last := i == tokenize.TrustMismatches-1; (d != 0) != last || (last && (!shapeOnly || d != tokenize.DistrustFirst)) {
			t.Fatalf("mismatch %d of the shape: distrust %v (shape only %v)", i+1, d, shapeOnly)
		}
	}
	if !c.Distrusted("m", chat, tools, now) {
		t.Fatal("the wrong shape is not distrusted")
	}
	if c.Distrusted("m", chat, 0, now) || c.Distrusted("m", chat, tokenize.ShapeTools, now) {
		t.Fatal("the endpoint's other shapes are distrusted too")
	}
	if got := tools.String(); got != "tools+tool_turns" {
		t.Fatalf("String() = %q", got)
	}
}

// TestShape: Build reports what a request renders beyond text turns.
func TestShape(t *testing.T) {
	tests := []struct {
		path, body string
		want       tokenize.Shape
	}{
		{tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"the \"tool\" word"}]}`, 0},
		{tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"tools":[]}`, 0},
		{tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, tokenize.ShapeTools},
		{tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"42","tool_call_id":"c"}]}`, tokenize.ShapeToolTurns},
		{tokenize.PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}`, tokenize.ShapeKwargs},
		{tokenize.PathMessages, `{"system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, tokenize.ShapeSystem},
		{tokenize.PathResponses, `{"instructions":"be brief","input":"hi","reasoning":{"effort":"low"}}`, tokenize.ShapeSystem | tokenize.ShapeKwargs},
	}
	for _, tc := range tests {
		if _, _, got, _ := tokenize.Build(tc.path, []byte(tc.body), "m"); got != tc.want {
			t.Errorf("%s %s: shape %s, want %s", tc.path, tc.body, got, tc.want)
		}
	}
}
