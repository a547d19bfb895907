package vllmsim

import (
	"fmt"
	"net/http"
)

// apiError is a client-facing error: an HTTP status and a message. Each
// endpoint writes it in its own dialect (OpenAI or Anthropic).
type apiError struct {
	status int
	msg    string
	// typ and param are the OpenAI error's type and param where vLLM names
	// them itself; an empty typ follows the status ([openAIErrorType]) and
	// an empty param is null.
	typ, param string
}

func (e *apiError) Error() string { return e.msg }

// errorf builds an apiError with a formatted message.
func errorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// invalidRequest builds the error vLLM's handlers make with
// create_error_response(err_type="invalid_request_error", param=param).
func invalidRequest(status int, param, format string, args ...any) *apiError {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...), typ: "invalid_request_error", param: param}
}

// badParam builds a 400 that names the parameter at fault, as vLLM's
// request validation errors do (param is pydantic's location, e.g.
// "body.request_id" or "query.stream": vllm/frontend/entrypoints/serve/
// exception_handling/handlers/validation.py at 055e47c28003).
func badParam(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), param: param}
}

// errInjected is the answer to a request the fail rate rejects.
var errInjected = &apiError{status: http.StatusServiceUnavailable, msg: "vllmsim: injected failure (fail rate)"}

// openAIErrorType is the error type vLLM's OpenAI server reports for a
// status.
func openAIErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLargeError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		return "InternalServerError"
	}
}

// openAIErrorBody is vLLM's OpenAI error object.
type openAIErrorBody struct {
	Error openAIErrorDetail `json:"error"`
}

type openAIErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// writeOpenAIError writes {"error":{"message","type","param","code"}}.
func writeOpenAIError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, openAIErrorBody{Error: openAIErrorDetail{Message: msg, Type: typ, Code: status}})
}

// writeOpenAI writes e in the OpenAI dialect.
func (e *apiError) writeOpenAI(w http.ResponseWriter) {
	typ := e.typ
	if typ == "" {
		typ = openAIErrorType(e.status)
	}
	d := openAIErrorDetail{Message: e.msg, Type: typ, Code: e.status}
	if e.param != "" {
		d.Param = &e.param
	}
	writeJSON(w, e.status, openAIErrorBody{Error: d})
}

// anthropicErrorType is the Anthropic API's error type for a status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusMethodNotAllowed:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	default:
		return "api_error"
	}
}

type anthropicErrorBody struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// writeAnthropic writes e in the Anthropic dialect:
// {"type":"error","error":{"type","message"}}.
func (e *apiError) writeAnthropic(w http.ResponseWriter) {
	writeJSON(w, e.status, anthropicErrorBody{
		Type:  "error",
		Error: anthropicErrorDetail{Type: anthropicErrorType(e.status), Message: e.msg},
	})
}
