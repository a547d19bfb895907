package delivery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"rolter.dev/pkg/delivery"
)

// sanitizer is a stub PII service: it replaces "Alice" with "<PERSON_1>"
// and hands out the token "tok-<request id>" for reversible requests; its
// restore endpoint undoes that for the right token only.
type sanitizer struct {
	*httptest.Server
	mu        sync.Mutex
	sanitizes []delivery.SanitizePayload
	restores  []delivery.RestorePayload
	broken    bool // answer 500
	short     bool // answer one element too few
}

func newSanitizer(t *testing.T) *sanitizer {
	t.Helper()
	s := &sanitizer{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sanitize", func(w http.ResponseWriter, r *http.Request) {
		var in delivery.SanitizePayload
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		s.sanitizes = append(s.sanitizes, in)
		broken, short := s.broken, s.short
		s.mu.Unlock()
		if broken {
			http.Error(w, "down", 500)
			return
		}
		out := delivery.SanitizeReply{}
		n := 0
		for _, c := range in.Content {
			n += strings.Count(c, "Alice")
			out.Content = append(out.Content, strings.ReplaceAll(c, "Alice", "<PERSON_1>"))
		}
		if short {
			out.Content = out.Content[1:]
		}
		out.Findings = []delivery.Finding{{EntityType: "PERSON", Count: n}}
		if in.Reversible {
			out.RestorationToken = "tok-" + in.RequestID
		}
		json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("POST /restore", func(w http.ResponseWriter, r *http.Request) {
		var in delivery.RestorePayload
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		s.restores = append(s.restores, in)
		broken := s.broken
		s.mu.Unlock()
		if broken || in.RestorationToken != "tok-"+in.RequestID {
			http.Error(w, "bad token", http.StatusForbidden)
			return
		}
		out := delivery.RestoreReply{}
		for _, c := range in.Content {
			out.Content = append(out.Content, strings.ReplaceAll(c, "<PERSON_1>", "Alice"))
		}
		json.NewEncoder(w).Encode(out)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *sanitizer) counts() (sanitizes, restores int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sanitizes), len(s.restores)
}

func (s *sanitizer) set(broken, short bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.broken, s.short = broken, short
}

func piiConfig(s *sanitizer, direction, restoration string) delivery.Config {
	cfg := baseConfig()
	cfg.PII.Enabled = true
	cfg.PII.URL = s.URL + "/sanitize"
	cfg.PII.RestoreURL = s.URL + "/restore"
	cfg.PII.Direction = direction
	cfg.PII.Restoration = restoration
	return cfg
}

const (
	piiRequest  = `{"model":"m","messages":[{"role":"system","content":"You help Alice."},{"role":"user","content":"I am Alice"}],"metadata":{"k":"Alice"}}`
	piiResponse = `{"choices":[{"message":{"role":"assistant","content":"Hello <PERSON_1>!"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
)

func TestPIIRequestLeg(t *testing.T) {
	tests := []struct {
		name        string
		restoration string
		optIn       bool
		wantTicket  bool
	}{
		{"restoration never: no ticket", delivery.RestorationNever, true, false},
		{"trusted_downstream: ticket", delivery.RestorationTrustedDownstream, false, true},
		{"caller_authorized without the header: no ticket", delivery.RestorationCallerAuthorized, false, false},
		{"caller_authorized with the header: ticket", delivery.RestorationCallerAuthorized, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSanitizer(t)
			p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, tc.restoration))
			r := req
			r.PIIRestoreOptIn = tc.optIn
			body := []byte(piiRequest)
			leg, refuse := p.SanitizeRequest(t.Context(), r, body)
			if refuse != nil {
				t.Fatalf("refused: %+v", refuse)
			}
			want := `{"model":"m","messages":[{"role":"system","content":"You help <PERSON_1>."},{"role":"user","content":"I am <PERSON_1>"}],"metadata":{"k":"Alice"}}`
			if string(leg.Body) != want || !leg.Changed {
				t.Errorf("body = %s (changed %v), want %s", leg.Body, leg.Changed, want)
			}
			if string(body) != piiRequest {
				t.Error("SanitizeRequest modified its input")
			}
			if (leg.Ticket != nil) != tc.wantTicket {
				t.Errorf("ticket = %v, want %v", leg.Ticket != nil, tc.wantTicket)
			}
			s.mu.Lock()
			got := s.sanitizes[0]
			s.mu.Unlock()
			if got.Direction != "request" || got.Reversible != tc.wantTicket || got.RequestID != "req-1" || got.Model != "gpt-x" || len(got.Content) != 2 {
				t.Errorf("sanitize request = %+v", got)
			}
			if p.Stats().PIIEntities.Load() != 2 {
				t.Errorf("entities = %d", p.Stats().PIIEntities.Load())
			}
		})
	}
}

// TestPIIRequestLegSanitizesToolResults: the records an agent read reach
// the model as tool results; the request leg sanitizes them as it does the
// conversation, and leaves the tool call's input as it is.
func TestPIIRequestLegSanitizesToolResults(t *testing.T) {
	s := newSanitizer(t)
	p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationNever))
	in := `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"lookup","input":{"q":"Alice"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"row: Alice, 42"}]}]}]}`
	leg, refuse := p.SanitizeRequest(t.Context(), req, []byte(in))
	if refuse != nil {
		t.Fatalf("refused: %+v", refuse)
	}
	want := `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"lookup","input":{"q":"Alice"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"row: <PERSON_1>, 42"}]}]}]}`
	if string(leg.Body) != want || !leg.Changed {
		t.Errorf("body = %s (changed %v), want %s", leg.Body, leg.Changed, want)
	}
}

func TestPIIResponseLegAndRestoration(t *testing.T) {
	// ticketFor runs the request leg for r and returns the ticket.
	ticketFor := func(t *testing.T, p *delivery.Policy, r delivery.Request) *delivery.Ticket {
		t.Helper()
		leg, refuse := p.SanitizeRequest(t.Context(), r, []byte(piiRequest))
		if refuse != nil || leg.Ticket == nil {
			t.Fatalf("no ticket (refuse %+v)", refuse)
		}
		return leg.Ticket
	}
	t.Run("trusted_downstream restores with the request's own ticket", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationTrustedDownstream))
		r := req
		r.PIITicket = ticketFor(t, p, r)
		if !p.Active(r) {
			t.Error("not Active with a ticket to redeem")
		}
		stored := []byte(piiResponse)
		send := mustSend(t, p.Apply(t.Context(), r, 200, jsonCT, stored))
		if want := strings.Replace(piiResponse, "<PERSON_1>", "Alice", 1); string(send.Body) != want {
			t.Errorf("body = %s, want %s", send.Body, want)
		}
		if string(stored) != piiResponse {
			t.Error("the restore reached the stored bytes")
		}
		if _, restores := s.counts(); restores != 1 || p.Stats().PIIRestorations.Load() != 1 {
			t.Errorf("restores = %d / %d", restores, p.Stats().PIIRestorations.Load())
		}
	})
	t.Run("no ticket: no restore call", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationTrustedDownstream))
		if p.Active(req) {
			t.Error("Active with nothing to do")
		}
		send := mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(piiResponse)))
		if string(send.Body) != piiResponse {
			t.Errorf("body = %s", send.Body)
		}
		if sanitizes, restores := s.counts(); sanitizes+restores != 0 {
			t.Errorf("calls: %d sanitize, %d restore", sanitizes, restores)
		}
	})
	t.Run("a ticket issued for another route is not redeemed", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationTrustedDownstream))
		other := req
		other.Route = "other"
		r := req
		r.PIITicket = ticketFor(t, p, other)
		send := mustSend(t, p.Apply(t.Context(), r, 200, jsonCT, []byte(piiResponse)))
		if string(send.Body) != piiResponse {
			t.Errorf("body = %s", send.Body)
		}
	})
	t.Run("caller_authorized needs the header on the request being answered", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationCallerAuthorized))
		optIn := req
		optIn.PIIRestoreOptIn = true
		ticket := ticketFor(t, p, optIn)

		without := req
		without.PIITicket = ticket
		if send := mustSend(t, p.Apply(t.Context(), without, 200, jsonCT, []byte(piiResponse))); string(send.Body) != piiResponse {
			t.Errorf("restored without the header: %s", send.Body)
		}
		with := optIn
		with.PIITicket = ticket
		if send := mustSend(t, p.Apply(t.Context(), with, 200, jsonCT, []byte(piiResponse))); !bytes.Contains(send.Body, []byte("Hello Alice!")) {
			t.Errorf("not restored with the header: %s", send.Body)
		}
	})
	t.Run("direction response sanitizes the assistant text", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionResponse, delivery.RestorationNever))
		leg, _ := p.SanitizeRequest(t.Context(), req, []byte(piiRequest))
		if leg.Changed {
			t.Error("request leg ran with direction response")
		}
		body := `{"content":[{"type":"text","text":"Ask Alice."}],"usage":{"input_tokens":1,"output_tokens":2}}`
		send := mustSend(t, p.Apply(t.Context(), req, 200, jsonCT, []byte(body)))
		if want := strings.Replace(body, "Alice", "<PERSON_1>", 1); string(send.Body) != want {
			t.Errorf("body = %s, want %s", send.Body, want)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.sanitizes) != 1 || s.sanitizes[0].Direction != "response" || s.sanitizes[0].Reversible {
			t.Errorf("sanitize calls = %+v", s.sanitizes)
		}
	})
	t.Run("direction both sanitizes, then restores the request's placeholders", func(t *testing.T) {
		s := newSanitizer(t)
		p := newPolicy(t, piiConfig(s, delivery.DirectionBoth, delivery.RestorationTrustedDownstream))
		r := req
		r.PIITicket = ticketFor(t, p, r)
		send := mustSend(t, p.Apply(t.Context(), r, 200, jsonCT, []byte(`{"choices":[{"text":"Alice"}]}`)))
		if string(send.Body) != `{"choices":[{"text":"Alice"}]}` {
			t.Errorf("body = %s", send.Body)
		}
		if sanitizes, restores := s.counts(); sanitizes != 2 || restores != 1 {
			t.Errorf("calls: %d sanitize, %d restore", sanitizes, restores)
		}
	})
}

// A sanitizer call whose request ended first (the client left) is
// counted in CallsCancelled, not as a sanitizer error.
func TestPIICallCancelledIsNoError(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server sees the client leave
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	cfg := baseConfig()
	cfg.PII.Enabled = true
	cfg.PII.URL = srv.URL + "/sanitize"
	cfg.PII.Direction = delivery.DirectionBoth
	cfg.PII.Restoration = delivery.RestorationNever
	cfg.PII.TimeoutMS = 60_000
	p := newPolicy(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-arrived; cancel() }()
	p.SanitizeRequest(ctx, req, []byte(piiRequest))
	if got := p.Stats().PIIErrors.Load(); got != 0 {
		t.Errorf("pii errors = %d, want 0 for a cancelled call", got)
	}
	if got := p.Stats().CallsCancelled.Load(); got != 1 {
		t.Errorf("cancelled calls = %d, want 1", got)
	}
}

func TestPIIFailures(t *testing.T) {
	for _, mode := range []string{delivery.FailOpen, delivery.FailClosed} {
		for _, fault := range []string{"500", "short reply"} {
			t.Run(mode+"/"+fault, func(t *testing.T) {
				s := newSanitizer(t)
				cfg := piiConfig(s, delivery.DirectionBoth, delivery.RestorationNever)
				cfg.PII.FailureMode = mode
				p := newPolicy(t, cfg)
				s.set(fault == "500", fault == "short reply")

				leg, refuse := p.SanitizeRequest(t.Context(), req, []byte(piiRequest))
				d := p.Apply(t.Context(), req, 200, jsonCT, []byte(piiResponse))
				if p.Stats().PIIErrors.Load() != 2 {
					t.Errorf("pii errors = %d", p.Stats().PIIErrors.Load())
				}
				if mode == delivery.FailOpen {
					if refuse != nil || string(leg.Body) != piiRequest || leg.Changed {
						t.Errorf("request leg: refuse %+v, body %s", refuse, leg.Body)
					}
					if send := mustSend(t, d); string(send.Body) != piiResponse {
						t.Errorf("response body = %s", send.Body)
					}
					return
				}
				if refuse == nil || refuse.Status != 502 || refuse.Code != delivery.CodePIIUnavailable {
					t.Errorf("request leg refuse = %+v", refuse)
				}
				mustRefuse(t, d, 502, delivery.CodePIIUnavailable)
				if p.Stats().PIIBlocks.Load() != 1 || p.Stats().Withheld.Load() != 1 {
					t.Errorf("blocks %d withheld %d", p.Stats().PIIBlocks.Load(), p.Stats().Withheld.Load())
				}
			})
		}
	}
	t.Run("a failed restore delivers the unrestored text", func(t *testing.T) {
		s := newSanitizer(t)
		cfg := piiConfig(s, delivery.DirectionRequest, delivery.RestorationTrustedDownstream)
		cfg.PII.FailureMode = delivery.FailClosed
		p := newPolicy(t, cfg)
		leg, _ := p.SanitizeRequest(t.Context(), req, []byte(piiRequest))
		r := req
		r.PIITicket = leg.Ticket
		s.set(true, false)
		send := mustSend(t, p.Apply(t.Context(), r, 200, jsonCT, []byte(piiResponse)))
		if string(send.Body) != piiResponse || p.Stats().PIIRestoreErrors.Load() != 1 {
			t.Errorf("body %s, restore errors %d", send.Body, p.Stats().PIIRestoreErrors.Load())
		}
	})
}

// TestPIITooManyTexts: a request holding more texts than the sanitizer is
// given (65,536 prompts) would send the rest on unsanitized; under
// fail_closed it is refused and says why, under fail_open the texts given
// are sanitized and the rest forwarded as they are.
func TestPIITooManyTexts(t *testing.T) {
	body := `{"prompt":["Alice"` + strings.Repeat(`,""`, 1<<16) + `,"Alice"]}`
	for _, mode := range []string{delivery.FailOpen, delivery.FailClosed} {
		t.Run(mode, func(t *testing.T) {
			s := newSanitizer(t)
			cfg := piiConfig(s, delivery.DirectionRequest, delivery.RestorationNever)
			cfg.PII.FailureMode = mode
			p := newPolicy(t, cfg)
			leg, refuse := p.SanitizeRequest(t.Context(), req, []byte(body))
			if mode == delivery.FailClosed {
				if refuse == nil || refuse.Code != delivery.CodePIIUnavailable || !strings.Contains(refuse.Message, "more than 65536 texts") ||
					!strings.HasSuffix(refuse.Reason, "too_many_texts") {
					t.Fatalf("refuse = %+v", refuse)
				}
				return
			}
			if refuse != nil {
				t.Fatalf("refused under fail_open: %+v", refuse)
			}
			if !strings.HasPrefix(string(leg.Body), `{"prompt":["<PERSON_1>",""`) || !strings.HasSuffix(string(leg.Body), `,"Alice"]}`) {
				t.Errorf("body starts %.40s, ends %s", leg.Body, leg.Body[len(leg.Body)-20:])
			}
			if p.Stats().PIIErrors.Load() != 1 {
				t.Errorf("pii errors = %d, want 1", p.Stats().PIIErrors.Load())
			}
		})
	}
}

func TestRestoreOptIn(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, " YES ": true, "True": true, "0": false, "no": false, "": false, "on": false} {
		h := http.Header{}
		if v != "" {
			h.Set("x-rolter-pii-restore", v)
		}
		if got := delivery.RestoreOptIn(h); got != want {
			t.Errorf("RestoreOptIn(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestTicketNeverShowsItsToken(t *testing.T) {
	s := newSanitizer(t)
	p := newPolicy(t, piiConfig(s, delivery.DirectionRequest, delivery.RestorationTrustedDownstream))
	leg, _ := p.SanitizeRequest(t.Context(), req, []byte(piiRequest))
	tk := leg.Ticket
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "ticket", tk, "value", *tk)
	js, _ := json.Marshal(struct {
		T *delivery.Ticket
		V delivery.Ticket
	}{tk, *tk})
	r := req
	r.PIITicket = tk
	for _, out := range []string{
		fmt.Sprintf("%v %+v %#v %s", tk, tk, tk, tk),
		fmt.Sprintf("%v %+v %#v", *tk, *tk, *tk),
		fmt.Sprintf("%+v %#v", r, r),
		logged.String(), string(js),
	} {
		if strings.Contains(out, "tok-") {
			t.Errorf("token leaked: %s", out)
		}
	}
}
