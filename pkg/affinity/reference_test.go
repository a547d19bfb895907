package affinity_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/zeebo/xxh3"

	"rolter.dev/pkg/affinity"
	"rolter.dev/pkg/routing"
)

// This file is the reference the streaming reader is checked against: the
// prompt rules written as plainly as possible over a tree that encoding/json
// decodes. Objects are decoded into an ordered member list rather than
// map[string]any because the digest covers compact JSON with keys in the
// order written; lookups take the last occurrence of a key, as a map does.

type object []member

type member struct {
	k string
	v any
}

// get returns the last value of key k, as map[string]any would hold it.
func (o object) get(k string) (any, bool) {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].k == k {
			return o[i].v, true
		}
	}
	return nil, false
}

// decodeOrdered decodes a valid JSON document into object, []any, string,
// json.Number, bool and nil values.
func decodeOrdered(body []byte) (any, bool) {
	if !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		panic(fmt.Sprintf("decoding a valid document: %v", err))
	}
	return v, true
}

func decodeValue(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := t.(json.Delim)
	if !ok {
		return t, nil
	}
	switch d {
	case '{':
		o := object{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			o = append(o, member{kt.(string), v})
		}
		_, err = dec.Token()
		return o, err
	default:
		a := []any{}
		for dec.More() {
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err = dec.Token()
		return a, err
	}
}

// compactJSON is the canonical compact form the digest covers: no
// whitespace, keys in the order written, numbers as written, strings with
// '"', '\\' and control characters escaped and everything else as UTF-8.
func compactJSON(v any) string {
	var sb strings.Builder
	writeCompact(&sb, v)
	return sb.String()
}

func writeCompact(sb *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		sb.WriteString("null")
	case bool:
		fmt.Fprint(sb, v)
	case json.Number:
		sb.WriteString(string(v))
	case string:
		writeQuoted(sb, v)
	case []any:
		sb.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				sb.WriteByte(',')
			}
			writeCompact(sb, e)
		}
		sb.WriteByte(']')
	case object:
		sb.WriteByte('{')
		for i, m := range v {
			if i > 0 {
				sb.WriteByte(',')
			}
			writeQuoted(sb, m.k)
			sb.WriteByte(':')
			writeCompact(sb, m.v)
		}
		sb.WriteByte('}')
	default:
		panic(fmt.Sprintf("unexpected %T", v))
	}
}

func writeQuoted(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\b':
			sb.WriteString(`\b`)
		case r == '\f':
			sb.WriteString(`\f`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(sb, `\u%04x`, r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte('"')
}

// ref accumulates the whole (uncut) text, the length and the digest.
type ref struct {
	text strings.Builder
	n    int
	h    *xxh3.Hasher
}

func (r *ref) push(s string) {
	r.n += len(s)
	r.h.WriteString(s)
	r.text.WriteString(s)
}

func (r *ref) absorb(v any, measured bool) {
	s, ok := v.(string)
	if !ok {
		s = compactJSON(v)
	}
	r.h.WriteString(s)
	if measured {
		r.n += len(s)
	}
}

func (r *ref) pushTurn(role string, content any) {
	r.push(role)
	r.push(": ")
	r.pushText(content)
	r.push("\n")
}

func (r *ref) pushText(content any) {
	switch c := content.(type) {
	case string:
		r.push(c)
	case []any:
		for _, part := range c {
			switch p := part.(type) {
			case string:
				r.push(p)
			case object:
				if t, ok := p.get("text"); ok {
					if ts, ok := t.(string); ok {
						r.push(ts)
						continue
					}
				}
				r.pushPart(p)
			}
		}
	}
}

func (r *ref) pushPart(p object) {
	typ, _ := p.get("type")
	ts, _ := typ.(string)
	switch ts {
	case "tool_result":
		content, ok := p.get("content")
		if !ok {
			r.absorb(p, false)
			return
		}
		blocks, ok := content.([]any)
		if !ok {
			r.absorb(content, true)
			return
		}
		for _, block := range blocks {
			if bo, ok := block.(object); ok {
				if t, ok := bo.get("text"); ok {
					r.absorb(t, true)
					continue
				}
			}
			r.absorb(block, false)
		}
	case "tool_use":
		if in, ok := p.get("input"); ok {
			r.absorb(in, true)
		} else {
			r.absorb(p, true)
		}
	default:
		r.absorb(p, false)
	}
}

func (r *ref) turns(items any) {
	arr, ok := items.([]any)
	if !ok {
		return
	}
	for _, item := range arr {
		o, _ := item.(object)
		role := "item"
		if rv, ok := o.get("role"); ok {
			if rs, ok := rv.(string); ok {
				role = rs
			}
		}
		if c, ok := o.get("content"); ok {
			r.pushTurn(role, c)
		} else if out, ok := o.get("output"); ok {
			r.absorb(out, true)
		} else if args, ok := o.get("arguments"); ok {
			r.absorb(args, true)
		} else {
			r.absorb(item, false)
		}
		if tc, ok := o.get("tool_calls"); ok {
			if calls, ok := tc.([]any); ok {
				for _, call := range calls {
					if args, ok := pointer(call, "function", "arguments"); ok {
						r.absorb(args, true)
					} else {
						r.absorb(call, true)
					}
				}
			}
		}
	}
}

func pointer(v any, path ...string) (any, bool) {
	for _, k := range path {
		o, ok := v.(object)
		if !ok {
			return nil, false
		}
		if v, ok = o.get(k); !ok {
			return nil, false
		}
	}
	return v, true
}

// refAffinity returns the whole prompt text (not cut), its length and
// digest, or false when the body gives no prompt; with a salt, the text
// and digest start with the salt's line (BuildSalted), the length not.
func refAffinity(path string, body []byte, salt string) (string, int, uint64, bool) {
	v, valid := decodeOrdered(body)
	if !valid {
		return "", 0, 0, false
	}
	o, ok := v.(object)
	if !ok {
		return "", 0, 0, false
	}
	r := &ref{h: xxh3.New()}
	if salt != "" {
		line := "\x00cache_salt\x00" + salt + "\n"
		r.text.WriteString(line)
		_, _ = r.h.WriteString(line)
	}
	switch path {
	case affinity.PathChatCompletions:
		m, ok := o.get("messages")
		if !ok {
			return "", 0, 0, false
		}
		r.turns(m)
	case affinity.PathMessages:
		if s, ok := o.get("system"); ok {
			r.pushTurn("system", s)
		}
		m, ok := o.get("messages")
		if !ok {
			return "", 0, 0, false
		}
		r.turns(m)
	case affinity.PathResponses:
		if s, ok := o.get("instructions"); ok {
			r.pushTurn("system", s)
		}
		in, ok := o.get("input")
		if !ok {
			return "", 0, 0, false
		}
		if s, ok := in.(string); ok {
			r.pushTurn("user", s)
		} else {
			r.turns(in)
		}
	case affinity.PathCompletions, affinity.PathEmbeddings:
		field := "prompt"
		if path == affinity.PathEmbeddings {
			field = "input"
		}
		p, ok := o.get(field)
		if !ok {
			return "", 0, 0, false
		}
		r.pushText(p)
	default:
		return "", 0, 0, false
	}
	if r.n == 0 {
		return "", 0, 0, false
	}
	return r.text.String(), r.n, r.h.Sum64(), true
}

// cut returns the longest prefix of s, at most MaxBytes long, that ends on a
// character boundary.
func cut(s string) string {
	if len(s) <= affinity.MaxBytes {
		return s
	}
	n := affinity.MaxBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// refBuild is Build written with the reference reader.
func refBuild(path string, body []byte, h http.Header) routing.Context {
	ctx := routing.Context{
		SessionKey: h.Get("x-session-id"),
		TokenIDs:   routing.ParseTokenIDs(h.Get("x-rolter-vllm-token-ids")),
	}
	if text, n, digest, ok := refAffinity(path, body, ""); ok {
		ctx.Prompt, ctx.PromptLen, ctx.PromptDigest, ctx.HasDigest = cut(text), n, digest, true
	} else if utf8.Valid(body) {
		ctx.Prompt = cut(string(body))
	}
	return ctx
}
