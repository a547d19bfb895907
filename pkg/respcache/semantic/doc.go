// Package semantic decides which requests the semantic response cache may
// compare, and how: [Classify] splits a request into the text that is
// embedded and a partition that must match exactly, [Cosine] compares two
// embeddings, and [HTTPEmbedder] obtains an embedding from a provider's
// /v1/embeddings endpoint.
//
// # Why a partition
//
// A semantic hit replays a reply produced for a different request, so similar
// wording is not enough: "Answer in German" and "Answer in Japanese" embed
// almost identically, and the same question asked with stream true and false,
// with different tools or a different response_format expects incompatible
// replies. So only the conversation text is compared by similarity; every
// other field of the body as forwarded is hashed into the partition, and a
// lookup only ever sees entries of its own partition.
//
// The partition is an allowlist of what may vary, not a list of what must
// match. Left out are only the conversation text (OpenAI chat and Anthropic
// messages' user and assistant turns, a completion's prompt), "user" and
// "metadata" (attribution that does not change the reply), and "stream":
// false, which equals an absent stream. Everything else is in: model,
// stream: true, stream_options, tools, tool_choice, response_format, sampling
// and length parameters, Anthropic's top-level system, OpenAI system and
// developer messages together with their positions in the conversation, the
// dialect, and any field the gateway does not know (which costs hit rate,
// never correctness). Fields are hashed in their canonical form (package
// canon), so key order and whitespace do not split partitions. Changing these
// rules must bump the cache's layout version, so entries classified under the
// old rules are never read again.
//
// # Bypass
//
// A request whose meaning the text would not capture is not classified
// (ok = false) and costs no embedding call: a path other than
// /v1/chat/completions, /v1/messages and /v1/completions; a body that is not
// a JSON object; a turn with a key other than role, content and name (tool
// calls, function calls, audio, refusal…); a role other than user and
// assistant (plus system and developer in OpenAI chat); content that is not a
// string or an array of text parts (images, audio, files, documents,
// tool_use, tool_result); a prompt that is not a string (batches, token ids);
// and a request with no conversation text at all.
//
// # Concurrency
//
// [Classify] and [Cosine] are safe for concurrent use. An [HTTPEmbedder] is
// safe for concurrent use once its fields are set.
package semantic
