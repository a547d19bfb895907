package tokenize

import "net/http"

// NewLimited is New with a cache bound of limit token ids instead of
// CacheTokens, so that a test fills it with small answers.
func NewLimited(hc *http.Client, limit int) *Client {
	c := New(hc)
	c.limit = limit
	return c
}

// EntryOverhead is entryOverhead: what the bound charges an answer besides
// its ids.
const EntryOverhead = entryOverhead

// PythonDumps is pythonDumps: a tool input as Python's json.dumps prints it.
var PythonDumps = pythonDumps
