package vllmsim

import (
	"strconv"
	"testing"
)

func TestRememberResponseBound(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxStoredResponses {
		s.rememberResponse(strconv.Itoa(i), storedResponse{})
	}
	// Storing the oldest id again makes it the newest: the next response
	// drops "1", not "0".
	s.rememberResponse("0", storedResponse{})
	s.rememberResponse("new", storedResponse{})
	_, kept0 := s.storedResponse("0")
	_, kept1 := s.storedResponse("1")
	_, keptNew := s.storedResponse("new")
	if !kept0 || kept1 || !keptNew {
		t.Errorf(`stored "0" %v, "1" %v, "new" %v; want true, false, true`, kept0, kept1, keptNew)
	}
	if len(s.responses) != maxStoredResponses || len(s.responseOrder) != maxStoredResponses {
		t.Errorf("%d responses, %d ids in order; want %d each", len(s.responses), len(s.responseOrder), maxStoredResponses)
	}
}
