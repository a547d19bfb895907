package vllmsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds the OpenAI Responses API endpoints: create and retrieve
// (cancel and background mode are in responses_background.go). vllmsim
// stores responses as vLLM does when started with
// VLLM_ENABLE_RESPONSES_API_STORE=1 (vllm/frontend/entrypoints/openai/
// responses/serving.py at 055e47c28003): in the replica's memory, so that
// only the replica that produced a response can continue, retrieve or
// cancel it, and any other answers 404.

// maxStoredResponses bounds the responses kept for previous_response_id
// and retrieval; the oldest is dropped first. (vLLM keeps them all.)
const maxStoredResponses = 4096

// responsesRequest is the part of a Responses API request the simulator
// reads.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Stream             bool            `json:"stream"`
	// RequestID is vLLM's extra parameter request_id, which becomes the
	// response's id; raw, because null is an error too ([responsesRequest.id]).
	RequestID json.RawMessage `json:"request_id"`
	// Store is nil for null, which vLLM takes as false (its `store: bool |
	// None = True`); decoding starts it at true, the default.
	Store      *bool `json:"store"`
	Background bool  `json:"background"`
	// Reasoning's effort reaches the template as reasoning_effort.
	Reasoning *struct {
		Effort *string `json:"effort"`
	} `json:"reasoning"`
	// Tools' function tools reach the template as chat tools
	// ([responsesChatTools]).
	Tools json.RawMessage `json:"tools"`
	cacheSaltField
}

// functionToolFields are the fields of the openai package's FunctionTool
// (openai-python src/openai/types/responses/function_tool.py at e43b4224)
// but type.
var functionToolFields = []string{"name", "parameters", "strict", "allowed_callers", "defer_loading", "description", "output_schema"}

// responsesChatTools is a Responses request's tools as vLLM renders them:
// each function tool as the chat tool construct_tool_dicts builds from its
// FunctionTool dump (vllm/entrypoints/openai/responses/utils.py at
// 01ca842df5b1, vllm/tool_parsers/utils.py at 0064cc9cb1ae: every
// FunctionTool field but type, null where the client left it out, a field
// the client added kept); other tools add nothing. nil for no function
// tool. Numbers are kept as written.
func responsesChatTools(raw json.RawMessage) (json.RawMessage, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var tools []map[string]any
	if err := d.Decode(&tools); err != nil {
		return nil, badParam("body.tools", "tools: %v", err)
	}
	var out []any
	for i, t := range tools {
		if t["type"] != "function" {
			continue
		}
		if _, ok := t["name"].(string); !ok {
			return nil, badParam(fmt.Sprintf("body.tools.%d.function.name", i), "Field required")
		}
		fn := map[string]any{}
		for _, k := range functionToolFields {
			fn[k] = nil
		}
		for k, v := range t {
			if k != "type" {
				fn[k] = v
			}
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	if len(out) == 0 {
		return nil, nil
	}
	b, _ := json.Marshal(out)
	return b, nil
}

// id returns the response's id: request_id, as vLLM's
// ResponsesResponse.from_request sets id=request.request_id, or a fresh id
// (ResponsesRequest.request_id's default_factory; protocol.py at
// 055e47c28003). request_id is a str there, so null or any other non-string
// is pydantic's 400.
func (r *responsesRequest) id() (string, *apiError) {
	if r.RequestID == nil {
		return newID("resp_"), nil
	}
	var id string
	if firstByte(r.RequestID) != '"' || json.Unmarshal(r.RequestID, &id) != nil {
		return "", badParam("body.request_id", "request_id: Input should be a valid string")
	}
	return id, nil
}

// inputItem is one element of an array-valued input: a message (with or
// without "type":"message"), a function call or a function call output.
// Other item types add nothing to the prompt.
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// inputMessages converts a Responses input (a string or an array of items)
// to chat turns.
func inputMessages(raw json.RawMessage) ([]Message, *apiError) {
	switch firstByte(raw) {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, errorf(http.StatusBadRequest, "input: %v", err)
		}
		return []Message{{Role: "user", Content: s}}, nil
	case '[':
		var items []inputItem
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, errorf(http.StatusBadRequest, "input: %v", err)
		}
		var msgs []Message
		for i, it := range items {
			field := fmt.Sprintf("input[%d]", i)
			switch it.Type {
			case "", "message":
				if it.Role == "" {
					return nil, errorf(http.StatusBadRequest, "%s.role: required", field)
				}
				text, aerr := contentText(it.Content, field+".content")
				if aerr != nil {
					return nil, aerr
				}
				msgs = append(msgs, Message{Role: it.Role, Content: text})
			case "function_call":
				msgs = append(msgs, Message{Role: "assistant", Content: it.Name + " " + it.Arguments})
			case "function_call_output":
				text, aerr := contentText(it.Output, field+".output")
				if aerr != nil {
					return nil, aerr
				}
				msgs = append(msgs, Message{Role: "tool", Content: text})
			}
		}
		return msgs, nil
	case 0:
		return nil, errorf(http.StatusBadRequest, "input: required")
	}
	return nil, errorf(http.StatusBadRequest, "input: must be a string or an array of input items")
}

// responseObject is the Responses API's response.
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	Error              any                `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Metadata           map[string]string  `json:"metadata"`
	Model              string             `json:"model"`
	Output             []responseItem     `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          any                `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	Text               responseText       `json:"text"`
	ToolChoice         string             `json:"tool_choice"`
	Tools              []any              `json:"tools"`
	TopP               float64            `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               *string            `json:"user"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responseText struct {
	Format struct {
		Type string `json:"type"`
	} `json:"format"`
}

type responseItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// responseEvent is any event of a Responses stream; the fields a type does
// not use are omitted.
type responseEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseObject `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	Item           *responseItem   `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Logprobs       *[]any          `json:"logprobs,omitempty"`
}

// responseBuilder builds the response objects and events of one request.
type responseBuilder struct {
	req    *responsesRequest
	model  string
	id     string
	itemID string
	at     int64
	seq    int
	store  bool // the response is stored
}

// object returns the response in a state: "in_progress" (no output, no
// usage; g may be nil), or the final state of generation g.
func (b *responseBuilder) object(g *generation, final bool) *responseObject {
	o := &responseObject{
		ID: b.id, Object: "response", CreatedAt: b.at, Status: "in_progress", Background: b.req.Background,
		Instructions: b.req.Instructions, MaxOutputTokens: b.req.MaxOutputTokens,
		Metadata: map[string]string{}, Model: b.model, Output: []responseItem{},
		ParallelToolCalls: true, PreviousResponseID: b.req.PreviousResponseID,
		ServiceTier: "auto", Store: b.store, Temperature: 1, ToolChoice: "auto",
		Tools: []any{}, TopP: 1, Truncation: "disabled",
	}
	o.Text.Format.Type = "text"
	if !final {
		return o
	}
	o.Status = "completed"
	if g.p.length {
		o.Status = "incomplete"
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Output = []responseItem{*b.item(g.text(), o.Status)}
	u := &responseUsage{InputTokens: len(g.p.prompt), OutputTokens: g.emitted, TotalTokens: len(g.p.prompt) + g.emitted}
	u.InputTokensDetails.CachedTokens = g.cached
	o.Usage = u
	return o
}

func (b *responseBuilder) item(text, status string) *responseItem {
	it := &responseItem{Type: "message", ID: b.itemID, Status: status, Role: "assistant", Content: []outputText{}}
	if status != "in_progress" {
		it.Content = []outputText{*textPart(text)}
	}
	return it
}

func textPart(text string) *outputText {
	return &outputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// event returns the next event of the stream, numbered in order.
func (b *responseBuilder) event(typ string) responseEvent {
	e := responseEvent{Type: typ, SequenceNumber: b.seq}
	b.seq++
	return e
}

// storedResponse is a response as the server keeps it: a finished one, or
// a background one in any state.
type storedResponse struct {
	conv []Message       // the conversation previous_response_id continues
	obj  *responseObject // the response GET /v1/responses/{id} serves; replaced, never changed, once stored
}

// rememberResponse stores a response. A client's request_id may repeat an
// id: the later response replaces the earlier, as in vLLM's
// response_store, and becomes the newest.
func (s *Server) rememberResponse(id string, r storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rememberLocked(id, r)
}

// rememberLocked is rememberResponse with s.mu held.
func (s *Server) rememberLocked(id string, r storedResponse) {
	if s.responses == nil {
		s.responses = make(map[string]storedResponse)
	}
	if _, ok := s.responses[id]; ok {
		s.responseOrder = slices.DeleteFunc(s.responseOrder, func(o string) bool { return o == id })
	}
	s.responses[id] = r
	s.responseOrder = append(s.responseOrder, id)
	if len(s.responseOrder) > maxStoredResponses {
		delete(s.responses, s.responseOrder[0])
		s.responseOrder = s.responseOrder[1:]
	}
}

func (s *Server) storedResponse(id string) (storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.responses[id]
	return r, ok
}

// responseNotFound is vLLM's _make_not_found_error (serving.py at
// 055e47c28003), the answer to an unknown previous_response_id and to
// retrieving or cancelling an unknown response.
func responseNotFound(id string) *apiError {
	return invalidRequest(http.StatusNotFound, "response_id", "Response with id '%s' not found.", id)
}

// handleResponses serves POST /v1/responses. Unless the request says
// "store": false, the finished response and its conversation are kept in
// memory (the last 4096), so previous_response_id, GET and cancel work on
// the replica that produced the response and get 404 on any other, as with
// a real vLLM whose response store is local. A background request is
// stored at once, queued, and generated on a goroutine of its own
// (startBackground).
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	req := responsesRequest{Store: new(true)}
	if aerr := decodeJSON(body, &req); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	id, aerr := req.id()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	store := req.Store != nil && *req.Store
	if req.Background {
		// vLLM's validate_background (protocol.py at 055e47c28003) refuses
		// background without store when it parses the request.
		if !store {
			badParam("background", "background can only be used when `store` is true").writeOpenAI(w)
			return
		}
		// vLLM streams a background response from an event store that GET
		// ?stream=true replays (_run_background_request_stream); vllmsim
		// runs background requests without streaming only, and says so
		// before admitting the request.
		if req.Stream {
			badParam("stream", "vllmsim does not stream background responses: stream must be false when background is true").writeOpenAI(w)
			return
		}
	}
	turns, aerr := inputMessages(req.Input)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	// history is the conversation a later previous_response_id continues;
	// instructions lead this request's prompt only, as in OpenAI's API. An
	// unfinished background response's conversation has no assistant turn
	// yet (responses_background.go).
	var history []Message
	if req.PreviousResponseID != nil {
		prev, ok := s.storedResponse(*req.PreviousResponseID)
		if !ok {
			responseNotFound(*req.PreviousResponseID).writeOpenAI(w)
			return
		}
		history = append(history, prev.conv...)
	}
	history = append(history, turns...)
	conv := history
	if req.Instructions != nil && *req.Instructions != "" {
		conv = append([]Message{{Role: "system", Content: *req.Instructions}}, history...)
	}
	// The template's only input beyond the messages is the effort; a
	// Responses request has no kwargs of its own for either call to refuse.
	var f templateFields
	if req.Reasoning != nil {
		_ = f.addKwargs(nil, req.Reasoning.Effort, false)
	}
	if f.Tools, aerr = responsesChatTools(req.Tools); aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	tmpl, aerr := f.template()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	prompt := Tokenize(RenderChatTemplate(conv, tmpl))
	salt, aerr := req.salt()
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	p, aerr := s.prepare(r.URL.Path, req.Model, prompt, req.MaxOutputTokens, salt)
	if aerr != nil {
		aerr.writeOpenAI(w)
		return
	}
	b := &responseBuilder{req: &req, model: p.model, id: id, itemID: newID("msg_"), at: time.Now().Unix(), store: store}
	if req.Background {
		// _create_responses (serving.py at 055e47c28003): the queued
		// response, stored, is the answer; the task generates.
		writeJSON(w, http.StatusOK, s.startBackground(r.Context(), b, p, history))
		return
	}
	ctx := r.Context()
	remember := func(g *generation, final *responseObject) {
		if store {
			conv := append(append([]Message(nil), history...), Message{Role: "assistant", Content: g.text()})
			s.rememberResponse(b.id, storedResponse{conv: conv, obj: final})
		}
	}
	if !req.Stream {
		g, err := s.start(ctx, p)
		if err != nil {
			return
		}
		err = g.drain(ctx)
		g.close(err)
		if err != nil {
			return
		}
		final := b.object(g, true)
		remember(g, final)
		writeJSON(w, http.StatusOK, final)
		return
	}

	sse := startSSE(w)
	g, err := s.start(ctx, p)
	if err != nil {
		return
	}
	zero := 0
	send := func(e responseEvent) {
		if err == nil {
			err = sse.write(e.Type, e)
		}
	}
	e := b.event("response.created")
	e.Response = b.object(g, false)
	send(e)
	e = b.event("response.in_progress")
	e.Response = b.object(g, false)
	send(e)
	e = b.event("response.output_item.added")
	e.OutputIndex, e.Item = &zero, b.item("", "in_progress")
	send(e)
	e = b.event("response.content_part.added")
	e.ItemID, e.OutputIndex, e.ContentIndex, e.Part = b.itemID, &zero, &zero, textPart("")
	send(e)
	for err == nil {
		piece, ok, nerr := g.next(ctx)
		if err = nerr; !ok || err != nil {
			break
		}
		e = b.event("response.output_text.delta")
		e.ItemID, e.OutputIndex, e.ContentIndex, e.Delta, e.Logprobs = b.itemID, &zero, &zero, &piece, &[]any{}
		send(e)
	}
	final := b.object(g, true)
	text := g.text()
	e = b.event("response.output_text.done")
	e.ItemID, e.OutputIndex, e.ContentIndex, e.Text, e.Logprobs = b.itemID, &zero, &zero, &text, &[]any{}
	send(e)
	e = b.event("response.content_part.done")
	e.ItemID, e.OutputIndex, e.ContentIndex, e.Part = b.itemID, &zero, &zero, textPart(text)
	send(e)
	e = b.event("response.output_item.done")
	e.OutputIndex, e.Item = &zero, &final.Output[0]
	send(e)
	// vLLM stores the final response before it sends it
	// (responses_stream_generator, serving.py at 055e47c28003): a client
	// that has read it can retrieve or continue it at once.
	if err == nil {
		remember(g, final)
	}
	e = b.event("response." + final.Status) // response.completed or response.incomplete
	e.Response = final
	send(e)
	g.close(err)
}

// handleRetrieveResponse serves GET /v1/responses/{response_id} as vLLM's
// retrieve_responses (api_router.py and serving.py at 055e47c28003): the
// stored response, or 404. Its query parameters are checked first, as
// FastAPI does: starting_after an integer, stream a boolean.
//
// stream=true is a 400 here. vLLM replays only the events of a background
// streaming response (its event_store); for any other stored response its
// generator raises after the 200 event-stream header is sent, so the client
// gets a broken stream. vllmsim runs background requests without
// streaming only, so it has no stream to replay, and says so.
func (s *Server) handleRetrieveResponse(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if v, ok := lastQueryValue(q, "starting_after"); ok {
		if _, err := strconv.Atoi(strings.TrimSpace(v)); err != nil {
			badParam("query.starting_after", "starting_after: Input should be a valid integer, unable to parse string as an integer").writeOpenAI(w)
			return
		}
	}
	stream := false
	if v, ok := lastQueryValue(q, "stream"); ok {
		var valid bool
		if stream, valid = laxBool(v); !valid {
			badParam("query.stream", "stream: Input should be a valid boolean, unable to interpret input").writeOpenAI(w)
			return
		}
	}
	id := r.PathValue("response_id")
	stored, ok := s.storedResponse(id)
	if !ok {
		responseNotFound(id).writeOpenAI(w)
		return
	}
	if stream {
		errorf(http.StatusBadRequest, "vllmsim does not replay streams: retrieve response '%s' without stream=true", id).writeOpenAI(w)
		return
	}
	writeJSON(w, http.StatusOK, stored.obj)
}

// lastQueryValue returns a query parameter's last value, the one Starlette
// gives FastAPI.
func lastQueryValue(q map[string][]string, name string) (string, bool) {
	vs := q[name]
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// laxBool parses a string as pydantic's lax bool does: one of its
// spellings, in any case, without trimming.
func laxBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "1", "on", "t", "true", "y", "yes":
		return true, true
	case "0", "off", "f", "false", "n", "no":
		return false, true
	}
	return false, false
}
