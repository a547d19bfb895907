// Package sse records a server-sent-events stream while it is passed through
// to a client, so that a streamed response can be cached without delaying a
// byte of it, and replays recorded events as a well-formed stream.
//
// # Recording
//
// The proxy writes each chunk of the upstream body to the client first, then
// hands the same bytes to [Recorder.Write], which never fails and never
// blocks: it splits the bytes into events incrementally (an event may be cut
// anywhere across reads; lines may end in "\n", "\r\n" or "\r"), keeps each
// event with its line endings normalised to "\n", and drops comment-only
// events (keep-alives). Once the recording would exceed its size cap it is
// marked too large and discarded, and recording stops; the stream itself is
// unaffected. When the upstream body ends the proxy calls [Recorder.End] with
// the read error, or with the client's error if the client went away.
//
// [Recorder.Complete] reports whether the stream may be stored: it ended
// without error, it stayed within the cap, its terminal event was seen
// (OpenAI's "data: [DONE]", Anthropic's "event: message_stop"), and it
// carried no error event (Anthropic's "event: error", or an OpenAI-style data
// object with a top-level "error" member, or an "object" or "type" of
// "error").
//
// # Replay
//
// [Replay] writes stored events as "<event>\n\n", flushing after each one,
// so a client's SSE parser sees the same events as from the live stream.
//
// # Concurrency
//
// A Recorder is used by one goroutine at a time. Replay is safe for
// concurrent use with distinct writers.
package sse
