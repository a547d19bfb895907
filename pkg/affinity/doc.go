// Package affinity builds the [routing.Context] of a JSON inference request:
// the conversation text that prefix-affinity balancers match on, the length
// and xxh3 digest of the whole prompt, the session key and the token ids.
//
// # The prompt is the conversation, not the body
//
// [Build] reads each turn's role and text in the order the model sees them:
// messages for /v1/chat/completions, system then messages for /v1/messages,
// instructions then input for /v1/responses, prompt for /v1/completions and
// input for /v1/embeddings. Each turn is written as role + ": " + text + "\n".
// The JSON envelope ({"model":…,"messages":[{"role":…) is never part of the
// prompt: fed to a prefix trie it matches every request to a model by itself.
// The raw body is only the fallback for a path or shape that cannot be read
// (then the context carries no length and no digest).
//
// At most the first [MaxBytes] of the text are kept, cut on a UTF-8 character
// boundary; nothing is appended after the cut. The whole prompt is still
// measured and hashed while it is read, and past the cut the text's chunk
// fingerprint (rolter.dev/pkg/chunkindex's Chain, 8 bytes per 64 of text) is
// computed in full, so an approximate prefix index can match a long prompt
// without the text being kept. Tool calls and tool results count
// towards both the length and the digest, images, audio and files towards the
// digest only. Non-string values are hashed as compact JSON that is streamed
// into the hasher and never copied.
//
// # One pass, bounded memory
//
// The body is read by a small streaming JSON reader over the byte slice, not
// decoded into a tree. It validates the whole document (an invalid body gives
// the raw fallback, as does one nested deeper than encoding/json allows),
// decodes only the strings the prompt needs, and feeds everything else
// straight into the hasher. When a body's fields come in the order the model
// reads them (role before content, a part's type before its payload, system
// before messages), every byte is read once. A field that must wait for one
// written after it (content before role, messages before system, as
// key-sorting encoders write them) is first only delimited, by a scan that
// looks for quotes and brackets and remembers where long strings end, and
// read when its turn comes. A body whose duplicate keys or contradictory
// fields defeat that plan (the last duplicate wins, as with a map) is read
// again with every field delimited first. Either way a call costs a fixed
// number of allocations, the prompt string and the token ids when present,
// whatever the size of the body.
//
// # Compact JSON
//
// The digest of a non-string value covers its compact form: no whitespace
// between tokens, keys in the order written, numbers as written, strings
// decoded and written again with only '"', '\\' and control characters
// escaped (\b \f \n \r \t, else \u00xx). Bodies that differ only in
// formatting or in how a string is escaped hash alike.
package affinity
