// Package canon computes the canonical form of a JSON text: the form the
// response cache hashes, so that two requests that differ only in key order,
// insignificant whitespace or the spelling of string escapes get the same
// cache key.
//
// # The canonical form
//
//   - No insignificant whitespace.
//   - Object members sorted by key, recursively, comparing the bytes of each
//     key as encoding/json decodes it (UTF-8, so code point order). Of
//     duplicate keys only the last is kept, as encoding/json (and Python's
//     json) decode them.
//   - Numbers and the literals true, false and null exactly as written: a
//     number is never parsed and re-printed, so 1.0, 1 and 1e0 stay distinct
//     and no precision is lost.
//   - Strings re-encoded canonically: every escape that stands for a
//     character is replaced by the character itself ("\u00e9" and "é" are the
//     same string), except '"' and '\\', which are written \" and \\, and
//     the control characters below U+0020, written \b, \f, \n, \r, \t or
//     \u00XX (lowercase hex). "\/" becomes "/".
//
// String values are lossless where encoding/json is not: a lone surrogate
// escape ("\ud800") is kept as a lowercase escape, and bytes that are not
// valid UTF-8 are copied as they are, instead of both becoming U+FFFD. encoding/json
// reads the canonical form as the same value as the original (the fuzz target
// checks this), while two bodies an upstream could tell apart never share a
// canonical form.
//
// # One pass, no tree of Go values
//
// [Doc.Parse] validates the text in one pass over the bytes and records a flat
// index of its tokens (offsets into the source, 20 bytes per token); nothing
// is decoded into maps or interfaces. Emission walks the index, sorts each
// object's member list (skipped when the members are already in order) and
// copies scalars straight from the source, so every output byte is written
// once whatever the nesting: the cost is linear in the size plus the sort of
// each object's keys. Strings are scanned eight bytes at a time.
//
// Nesting deeper than [MaxDepth] is rejected, as encoding/json does.
//
// # Concurrency
//
// A [Doc] and the [Value]s that point into it are not safe for concurrent
// use; [Append] and [Write] are, and reuse pooled documents.
package canon
