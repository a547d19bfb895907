// Package delivery is rolter's delivery policy: the one function that
// finalises every buffered successful response before it reaches the
// client, whether it comes from the upstream or from the response cache.
//
// # Overview
//
// [Policy.Apply] runs three stages in order and returns a [Send] (the body,
// possibly transformed, and headers to add) or a [Refuse] (status, code,
// client message and a content-free reason for logs and the usage record):
//
//  1. Built-in output guardrails: the post_call rules of [guardrails]
//     (builtin detectors email, phone, api_token, payment_card with a Luhn
//     check, or a regexp) scan the assistant text of the response (OpenAI
//     chat choices[].message.content, completions choices[].text,
//     Anthropic content[].text, Responses output[].content[].text;
//     embeddings have none) and the model's reasoning (chat
//     reasoning_content and reasoning, Anthropic thinking blocks,
//     Responses reasoning text and summaries), up to max_scan_bytes;
//     tool-call arguments pass as they are, read only by block and
//     annotate rules with tool_calls. A block rule refuses
//     with 403 guardrail_blocked; redact rules rewrite only those string
//     values, every other byte of the JSON stays as it was; annotate rules
//     add the rule names in X-Rolter-Guardrail-Matched.
//  2. The post_response plugin chain: each [[plugins]] webhook with stage
//     post_response gets an [Envelope] and answers allow, block (403
//     plugin_blocked), transform (the body for the next stage) or annotate
//     (x- headers). A call that fails (unreachable, timeout, non-2xx, a
//     malformed [Reply]) is skipped under fail_open and refuses with 502
//     plugin_unavailable under fail_closed.
//  3. The PII sanitizer's response leg ([pii_sanitizer]): with direction
//     response or both the assistant text (and reasoning) is sanitized; with restoration
//     enabled and a [Ticket] from this request's leg ([Policy.SanitizeRequest])
//     the placeholders are restored through restore_url. A sanitize failure
//     follows failure_mode (fail_closed refuses with 502
//     pii_sanitizer_unavailable; the reference always failed open here); a
//     restore failure delivers the unrestored text.
//
// Statuses outside 2xx, bodies that are not JSON and text/event-stream
// bodies pass unchanged.
//
// Before routing, the proxy calls [Policy.GuardRequest] (pre_call rules:
// 400 guardrail_blocked, redaction of the request's texts, tool results
// included) and
// [Policy.SanitizeRequest] (the PII request leg, which returns the body to
// forward and the [Ticket] for the response leg; fail_closed failures
// refuse with 502 pii_sanitizer_unavailable).
//
// # Streams
//
// Streamed responses skip all three stages, cached or not. A stage that
// cannot be skipped refuses the stream up front: [Policy.StreamDecision]
// returns 400 guardrail_streaming_unsupported (post_call rules under
// streaming_post_call = "reject"), plugin_streaming_unsupported (a
// fail_closed post_response plugin) or pii_streaming_unsupported (a
// response leg under streaming = "reject").
//
// # The storage contract
//
// The response cache stores the upstream's own bytes, before Apply runs,
// and never what Apply returns. Apply runs again on every delivery,
// including exact and semantic hits, so a transform is re-applied per
// delivery, a rule or plugin installed by a hot reload reaches entries
// cached before it, and a PII restore, made with the ticket of the request
// being answered, is never persisted. Apply never modifies the body it is
// given.
//
// # Accounting
//
// Every Refuse from Apply is a withheld response (Stats.Withheld). On the
// live and cacheable-miss paths the upstream call is still billed: the
// caller parses usage from the upstream's bytes before Apply and records
// the row as withheld with [Refuse.Reason]; a refused hit records a
// zero-cost withheld row (package rolter.dev/pkg/usage).
//
// # Privacy
//
// Nothing this package logs or returns as a reason contains request or
// response content: logs name rules, plugins, failure classes and request
// ids. A plugin's block reason goes to the client only. A [Ticket] never
// prints or marshals its token.
//
// # Concurrency
//
// A [Policy] is immutable after [New] and safe for concurrent use. A hot
// reload builds a new Policy and swaps it in (for example with an
// atomic.Pointer); pass the same [Stats] to every generation with
// [WithStats] so the counters survive the swap.
//
// # Lifecycle
//
// A Policy holds no goroutines and no connections of its own; the
// *http.Client given to [New] belongs to the caller.
package delivery
