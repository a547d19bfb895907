// Package responseid names the responses an engine stores so that the
// gateway can find the engine again.
//
// vLLM and SGLang keep a stored Responses API answer (VLLM_ENABLE_RESPONSES_API_STORE)
// in the memory of the replica that produced it: a later request that
// continues it (previous_response_id), retrieves it (GET
// /v1/responses/{id}) or cancels it (POST /v1/responses/{id}/cancel)
// succeeds on that replica only, and any other answers 404. Both engines
// take the response's id from the request (the extra parameter request_id,
// which becomes ResponsesResponse.id: vllm/frontend/entrypoints/openai/
// responses/protocol.py, from_request, at 055e47c28003; SGLang's
// ResponsesRequest.request_id in python/sglang/srt/entrypoints/openai/
// protocol.py at 004c82e07d87), so the gateway
// chooses an id that names the target it sent the request to, and reads
// the target back from the id. Nothing is remembered: every proxy reads
// the same id the same way, across restarts.
package responseid

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
)

// An id the gateway issues is "resp_rt" followed by the target's tag (16
// hex digits) and 32 random hex digits. vLLM's own ids are "resp_" and 32
// hex digits (OpenAI's 48): none starts with "rt", which is not hex.
const (
	prefix   = "resp_rt"
	tagLen   = 16
	randLen  = 32
	idLength = len(prefix) + tagLen + randLen
)

// Tag is the part of an id that names a provider: a hash of its name, the
// same in every proxy and for every configuration that keeps the name.
func Tag(provider string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(provider))
	var b [8]byte
	return hex.EncodeToString(h.Sum(b[:0]))
}

// New returns a fresh response id naming the provider whose tag is tag.
func New(tag string) string {
	var r [randLen / 2]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return prefix + tag + hex.EncodeToString(r[:])
}

// TagOf returns the tag of an id the gateway issued; false for any other
// id (an engine's own, a client's).
func TagOf(id string) (string, bool) {
	if len(id) != idLength || id[:len(prefix)] != prefix {
		return "", false
	}
	for i := len(prefix); i < len(id); i++ {
		if c := id[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return id[len(prefix) : len(prefix)+tagLen], true
}

// Fields are the members of a Responses API request body read here.
type Fields struct {
	// Previous is the previous_response_id string ("" when absent, null or
	// not a string: the engine refuses the latter).
	Previous string
	// OwnID: the client set request_id, which the gateway then leaves as
	// it is (and cannot find the response's target from later).
	OwnID bool
	// Background: background is true; the engine answers at once with the
	// queued response and generates it later.
	Background bool
}

// Read returns the fields of a request body that is a valid JSON object.
// Only top-level members count, the last of a repeated key (as Python's
// json reads them); a key written with escapes is not found (the request
// is then routed as any other, and the engine answers it).
func Read(body []byte) Fields {
	if !bytes.Contains(body, []byte(`"previous_response_id"`)) && !bytes.Contains(body, []byte(`"request_id"`)) &&
		!bytes.Contains(body, []byte(`"background"`)) {
		return Fields{}
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return Fields{}
	}
	var f Fields
	if raw, ok := top["previous_response_id"]; ok {
		_ = json.Unmarshal(raw, &f.Previous) // not a string: ""
	}
	_, f.OwnID = top["request_id"]
	f.Background = string(top["background"]) == "true"
	return f
}

// WithID returns body (a JSON object) with a request_id member naming id
// first; the body is not changed. Read must have found no request_id.
func WithID(body []byte, id string) []byte {
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		return body
	}
	out := make([]byte, 0, len(body)+len(id)+16)
	out = append(out, body[:i+1]...)
	out = append(out, `"request_id":"`...)
	out = append(out, id...) // hex and letters: no escaping
	out = append(out, '"')
	if rest := bytes.TrimLeft(body[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body[i+1:]...)
}
