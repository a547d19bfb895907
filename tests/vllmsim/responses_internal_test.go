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

// TestFinishBackground checks how a background task's outcome updates the
// stored response, as _run_background_request and responses_full_generator
// do (serving.py at 055e47c28003).
func TestFinishBackground(t *testing.T) {
	final := &responseObject{ID: "resp_bg", Status: "completed"}
	tests := []struct {
		name       string
		stored     string // the stored response's status; "" for none
		finished   bool   // the generation finished (else it failed)
		wantStatus string // "" for not stored
		wantFinal  bool   // the stored response is the final one
	}{
		{name: "finished, queued", stored: "queued", finished: true, wantStatus: "completed", wantFinal: true},
		{name: "finished, cancelled meanwhile", stored: "cancelled", finished: true, wantStatus: "cancelled"},
		{name: "finished, no longer stored", finished: true, wantStatus: "completed", wantFinal: true},
		{name: "failed, queued", stored: "queued", wantStatus: "failed"},
		{name: "failed, in progress", stored: "in_progress", wantStatus: "failed"},
		{name: "failed, cancelled", stored: "cancelled", wantStatus: "cancelled"},
		{name: "failed, completed", stored: "completed", wantStatus: "completed"},
		{name: "failed, no longer stored"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(Options{})
			if err != nil {
				t.Fatal(err)
			}
			var before *responseObject
			if tc.stored != "" {
				before = &responseObject{ID: "resp_bg", Status: tc.stored}
				s.rememberResponse("resp_bg", storedResponse{obj: before})
			}
			task := &bgTask{id: "resp_bg"}
			s.tasks = map[*bgTask]struct{}{task: {}}
			s.taskByID = map[string]*bgTask{"resp_bg": task}
			conv := []Message{{Role: "user", Content: "x"}, {Role: "assistant", Content: "y"}}
			if tc.finished {
				s.finishBackground(task, conv, final)
			} else {
				s.finishBackground(task, nil, nil)
			}
			got, ok := s.storedResponse("resp_bg")
			switch {
			case tc.wantStatus == "" && ok:
				t.Errorf("stored %+v, want nothing", got.obj)
			case tc.wantStatus != "" && (!ok || got.obj.Status != tc.wantStatus):
				t.Errorf("stored %+v (%v), want status %s", got.obj, ok, tc.wantStatus)
			case ok && (got.obj == final) != tc.wantFinal:
				t.Errorf("stored the final response: %v, want %v", got.obj == final, tc.wantFinal)
			case ok && tc.wantFinal && len(got.conv) != 2:
				t.Errorf("conversation = %v, want the finished one", got.conv)
			}
			if before != nil && before.Status != tc.stored {
				t.Errorf("the stored object was changed in place to %s", before.Status)
			}
			if len(s.tasks) != 0 || len(s.taskByID) != 0 {
				t.Errorf("the task is still registered")
			}
		})
	}
}
