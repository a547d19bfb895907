// Package usage parses token usage from upstream responses and writes one
// accounting [Record] per request through a pluggable [Sink].
//
// # Overview
//
// [ParseJSON] reads the "usage" object of a buffered JSON response (OpenAI
// chat, completions and embeddings, OpenAI Responses, Anthropic Messages).
// An [SSEParser] is fed a stream chunk by chunk as it passes through the
// proxy, split anywhere, and returns the usage at [SSEParser.End]: the
// final OpenAI chunk with usage (none without stream_options.include_usage,
// which the proxy sets for the client unless the provider's stream_usage is
// off: the record is then usage_unknown), the Responses response.completed
// event, or Anthropic's message_start usage updated by message_delta. [Parse]
// picks one of the two by content type.
//
// [PriceTable.Bill] turns a [Usage] into the record's tokens and cost from
// the [[model_prices]] ([ModelPrice]); a cache hit costs zero.
//
// [JSONLines] is the default [Sink]: JSON lines on stdout or appended to a
// file ([accounting], [AccountingConfig]), written by a goroutine of its
// own behind a bounded queue, so the request path never blocks; when the
// queue is full records are dropped and counted.
//
// # Withheld responses
//
// A response the delivery policy refused is recorded with Withheld and the
// refusal's reason. On the live and cacheable-miss paths the usage is
// parsed from the upstream's bytes before the policy runs, so the row
// carries the provider's tokens and cost; a refused cache hit writes a
// zero-cost withheld row.
//
// # Privacy
//
// A Record holds identifiers, counts and timings only. No prompt or
// completion text ever enters this package's output.
//
// # Concurrency
//
// [JSONLines] and [PriceTable] are safe for concurrent use; an [SSEParser]
// is used by one goroutine at a time.
//
// # Lifecycle
//
// The caller that opens a [JSONLines] closes it: Close writes and flushes
// the queued records, stops the writer goroutine and closes the file the
// sink owns.
package usage
