package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// dialect is the API family of an endpoint, which decides the error shape.
type dialect int

const (
	dialectOpenAI dialect = iota
	dialectAnthropic
)

// apiError is one entry of the client-facing error catalogue: a stable code,
// its HTTP status, and the OpenAI and Anthropic error types. Internal errors
// never reach clients; only these do.
type apiError struct {
	status        int
	code          string
	openaiType    string
	anthropicType string
}

var (
	errInvalidJSON      = apiError{http.StatusBadRequest, "invalid_json", "invalid_request_error", "invalid_request_error"}
	errInvalidRequest   = apiError{http.StatusBadRequest, "invalid_request", "invalid_request_error", "invalid_request_error"}
	errUnsupported      = apiError{http.StatusBadRequest, "unsupported_endpoint", "invalid_request_error", "invalid_request_error"}
	errBodyTimeout      = apiError{http.StatusRequestTimeout, "request_timeout", "invalid_request_error", "invalid_request_error"}
	errContentEncoding  = apiError{http.StatusUnsupportedMediaType, "unsupported_content_encoding", "invalid_request_error", "invalid_request_error"}
	errTooLarge         = apiError{http.StatusRequestEntityTooLarge, "request_too_large", "invalid_request_error", "request_too_large"}
	errMissingKey       = apiError{http.StatusUnauthorized, "missing_api_key", "authentication_error", "authentication_error"}
	errInvalidKey       = apiError{http.StatusUnauthorized, "invalid_api_key", "authentication_error", "authentication_error"}
	errModelNotAllowed  = apiError{http.StatusForbidden, "model_not_allowed", "permission_error", "permission_error"}
	errProviderDenied   = apiError{http.StatusForbidden, "provider_not_allowed", "permission_error", "permission_error"}
	errModelNotFound    = apiError{http.StatusNotFound, "model_not_found", "invalid_request_error", "not_found_error"}
	errNotFound         = apiError{http.StatusNotFound, "not_found", "invalid_request_error", "not_found_error"}
	errMethodNotAllowed = apiError{http.StatusMethodNotAllowed, "method_not_allowed", "invalid_request_error", "invalid_request_error"}
	errNoTarget         = apiError{http.StatusServiceUnavailable, "no_target", "api_error", "overloaded_error"}
	errUpstream         = apiError{http.StatusBadGateway, "upstream_error", "api_error", "api_error"}
	errUpstreamTimeout  = apiError{http.StatusGatewayTimeout, "upstream_timeout", "api_error", "api_error"}
	// errShuttingDown: the proxy halted the request at the end of its drain
	// ([Proxy.Halt]). Not errUpstream: the upstream did not fail, and a 502
	// would count against it in every dashboard and alert; a 503 (with
	// Anthropic's overloaded_error, as errNoTarget) tells clients to try
	// again, which reaches another proxy.
	errShuttingDown = apiError{http.StatusServiceUnavailable, "shutting_down", "api_error", "overloaded_error"}
)

type openAIErrorBody struct {
	Error openAIError `json:"error"`
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Param   *string `json:"param"`
}

type anthropicErrorBody struct {
	Type  string         `json:"type"`
	Error anthropicError `json:"error"`
}

type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// writeError answers with e in the dialect of the endpoint.
func writeError(w http.ResponseWriter, d dialect, e apiError, msg string) {
	var body any
	if d == dialectAnthropic {
		body = anthropicErrorBody{Type: "error", Error: anthropicError{Type: e.anthropicType, Message: msg}}
	} else {
		body = openAIErrorBody{Error: openAIError{Message: msg, Type: e.openaiType, Code: e.code}}
	}
	b, _ := json.Marshal(body) // plain structs of strings always marshal
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Rolter-Error", e.code)
	// A length, not chunks: refuse flushes this before the handler ends.
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.status)
	_, _ = w.Write(b)
}

// errorEvent is the server-sent event that tells a streaming client its
// response broke off, in the endpoint's dialect: a data frame carrying an
// "error" object for OpenAI (what its SDKs raise on), an `error` event for
// Anthropic (as its API sends mid-stream errors). It is sent once the
// response has started, when the status line can no longer change.
func errorEvent(d dialect, e apiError, msg string) []byte {
	var b []byte
	if d == dialectAnthropic {
		b, _ = json.Marshal(anthropicErrorBody{Type: "error", Error: anthropicError{Type: e.anthropicType, Message: msg}})
		return append(append([]byte("event: error\ndata: "), b...), "\n\n"...)
	}
	b, _ = json.Marshal(openAIErrorBody{Error: openAIError{Message: msg, Type: e.openaiType, Code: e.code}})
	return append(append([]byte("data: "), b...), "\n\n"...)
}

// maxEchoedName bounds how much of a client's model name an error quotes
// back: enough to recognise it, not a copy of a megabyte-long name.
const maxEchoedName = 256

// echoedName is name as an error message quotes it, cut at maxEchoedName
// bytes (on a rune boundary) with "…" after the cut.
func echoedName(name string) string {
	if len(name) <= maxEchoedName {
		return name
	}
	cut := maxEchoedName
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}
