package vllmsim

import (
	"context"
	"maps"
	"net/http"
	"slices"
)

// This file holds the Responses API's background mode ("background": true)
// as vLLM runs it without streaming (_create_responses,
// _run_background_request and cancel_responses, vllm/frontend/entrypoints/
// openai/responses/serving.py at 055e47c28003):
//
//   - the create call stores the response in status "queued" (output [],
//     usage null) and answers it at once;
//   - the generation runs in a task of its own, on the engine like any
//     request; the stored response stays "queued" until the task ends (vLLM
//     stores no "in_progress" for a non-streaming background response),
//     when the final response ("completed" or "incomplete") replaces it
//     unless it was cancelled meanwhile, or, if the generation failed, it
//     becomes "failed" unless it is "completed" or "cancelled";
//   - cancel of a "queued" or "in_progress" response marks the stored
//     response "cancelled", stops the task, waits for it to end and answers
//     the stored response.
//
// A previous_response_id naming an unfinished background response is
// accepted, as in vLLM, whose msg_store holds the conversation from the
// create call and whose stored response has no output yet: the new prompt
// is that response's conversation without an assistant turn. Once the
// final response is stored, the assistant turn is part of it.

// bgTask is the generation of one background response.
type bgTask struct {
	id     string             // the response's id
	cancel context.CancelFunc // stops the generation
	done   chan struct{}      // closed once the task has stored its outcome
}

// startBackground stores the queued response of a background request,
// starts its generation on a goroutine of its own and returns the queued
// response. The generation outlives the create call's request: it ends
// with its output, a cancel or [Server.Reset]. history is the conversation
// the response continues (see handleResponses).
func (s *Server) startBackground(ctx context.Context, b *responseBuilder, p plan, history []Message) *responseObject {
	queued := b.object(nil, false)
	queued.Status = "queued"
	// The request's values (for the logs) stay; its end does not stop the
	// generation.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &bgTask{id: b.id, cancel: cancel, done: make(chan struct{})}
	// vLLM stores the queued response and registers the task with no await
	// in between: a cancel finds both or neither.
	s.mu.Lock()
	s.rememberLocked(b.id, storedResponse{conv: history, obj: queued})
	if s.tasks == nil {
		s.tasks = make(map[*bgTask]struct{})
		s.taskByID = make(map[string]*bgTask)
	}
	s.tasks[t] = struct{}{}
	// A repeated request_id replaces the task a cancel finds, as in vLLM's
	// background_tasks; the earlier task runs on.
	s.taskByID[b.id] = t
	s.mu.Unlock()
	go s.runBackground(ctx, t, b, p, history)
	return queued
}

// runBackground generates a background response, as a non-streaming
// request does, and stores its outcome.
func (s *Server) runBackground(ctx context.Context, t *bgTask, b *responseBuilder, p plan, history []Message) {
	defer close(t.done)
	defer t.cancel()
	g, err := s.start(ctx, p)
	if err != nil {
		s.finishBackground(t, nil, nil)
		return
	}
	err = g.drain(ctx)
	g.close(err)
	if err != nil {
		s.finishBackground(t, nil, nil)
		return
	}
	conv := append(slices.Clone(history), Message{Role: "assistant", Content: g.text()})
	s.finishBackground(t, conv, b.object(g, true))
}

// finishBackground stores a background task's outcome: final, the finished
// response and its conversation, or nil for a generation that did not
// finish.
func (s *Server) finishBackground(t *bgTask, conv []Message, final *responseObject) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tasks, t)
	if s.taskByID[t.id] == t {
		delete(s.taskByID, t.id)
	}
	stored, ok := s.responses[t.id]
	if final == nil {
		// _run_background_request: a failed generation marks the stored
		// response "failed" unless it is completed or cancelled. (vLLM
		// asserts the response is stored; vllmsim's bound may have dropped
		// it, and then there is nothing to mark.)
		if ok && stored.obj.Status != "completed" && stored.obj.Status != "cancelled" {
			s.responses[t.id] = storedResponse{conv: stored.conv, obj: withStatus(stored.obj, "failed")}
		}
		return
	}
	// responses_full_generator: "If the response is already cancelled,
	// don't update it." A response no longer stored is stored again.
	if !ok || stored.obj.Status != "cancelled" {
		s.rememberLocked(t.id, storedResponse{conv: conv, obj: final})
	}
}

// withStatus returns a copy of o in another status. Stored objects are
// replaced, never changed, as a retrieve may be encoding one.
func withStatus(o *responseObject, status string) *responseObject {
	c := *o
	c.Status = status
	return &c
}

// stopBackground stops every background generation and waits until each
// has stored its outcome.
func (s *Server) stopBackground() {
	s.mu.Lock()
	tasks := slices.Collect(maps.Keys(s.tasks))
	s.mu.Unlock()
	for _, t := range tasks {
		t.cancel()
	}
	for _, t := range tasks {
		<-t.done
	}
}

// handleCancelResponse serves POST /v1/responses/{response_id}/cancel as
// vLLM's cancel_responses (serving.py at 055e47c28003): an unknown id is a
// 404; a stored response that is neither queued nor in progress (a
// synchronous one, or a background one that has ended, cancelled included)
// is a 400 that leaves it as it is. Otherwise the stored response becomes
// "cancelled", the generation is stopped and awaited, and the answer is
// the stored response: the queued one, without output or usage, in status
// "cancelled".
func (s *Server) handleCancelResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("response_id")
	s.mu.Lock()
	stored, ok := s.responses[id]
	if !ok {
		s.mu.Unlock()
		responseNotFound(id).writeOpenAI(w)
		return
	}
	if st := stored.obj.Status; st != "queued" && st != "in_progress" {
		s.mu.Unlock()
		invalidRequest(http.StatusBadRequest, "response_id", "Cannot cancel a synchronous response.").writeOpenAI(w)
		return
	}
	cancelled := withStatus(stored.obj, "cancelled")
	s.responses[id] = storedResponse{conv: stored.conv, obj: cancelled}
	t := s.taskByID[id]
	s.mu.Unlock()
	if t != nil {
		t.cancel()
		select {
		case <-t.done:
		case <-r.Context().Done():
		}
	}
	writeJSON(w, http.StatusOK, cancelled)
}
