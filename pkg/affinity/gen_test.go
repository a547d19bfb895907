package affinity_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"unicode/utf8"

	"rolter.dev/pkg/affinity"
)

// gen makes random request bodies of every shape the prompt rules know and
// many they do not, with random key order, duplicate keys, escapes and
// whitespace. Values are built as ordered trees (object, []any, string,
// json.Number, bool, nil) and written by a writer that varies the formatting.
type gen struct {
	r    *rand.Rand
	long bool // allow strings long enough to cross MaxBytes
}

func (g *gen) n(k int) int              { return g.r.IntN(k) }
func (g *gen) chance(p float64) bool    { return g.r.Float64() < p }
func (g *gen) oneOf(s ...string) string { return s[g.n(len(s))] }

var alphabet = []string{
	"a", "b", "z", " ", "hello ", "world", ".", "é", "ß", "中文", "😀", "\"", "\\", "/",
	"\n", "\t", "\r", "\x01", "\x1f", "\u2028", "\x7f", "text", "system", "{", "}", "[", "]", ":", ",",
}

func (g *gen) str() string {
	var sb strings.Builder
	if g.long && g.chance(0.05) {
		// A long string whose multi-byte characters straddle the cut.
		target := 20000 + g.n(30000)
		for sb.Len() < target {
			sb.WriteString(g.oneOf("ab", "é", "中", "😀", "x\n", "\"q\""))
		}
		return sb.String()
	}
	for range g.n(12) {
		sb.WriteString(alphabet[g.n(len(alphabet))])
	}
	if g.chance(0.02) {
		sb.WriteString("\xff") // invalid UTF-8: decodes to U+FFFD
	}
	return sb.String()
}

func (g *gen) number() json.Number {
	return json.Number(g.oneOf("0", "-1", "42", "3.14", "-0.5", "1e10", "2E-3", "6.02e+23", "-0", "100000000000000000000"))
}

func (g *gen) scalar() any {
	switch g.n(5) {
	case 0:
		return g.str()
	case 1:
		return g.number()
	case 2:
		return g.chance(0.5)
	case 3:
		return nil
	default:
		return g.oneOf("text", "tool_result", "tool_use", "image_url", "user")
	}
}

func (g *gen) anyValue(depth int) any {
	if depth > 3 || g.chance(0.4) {
		return g.scalar()
	}
	if g.chance(0.5) {
		a := []any{}
		for range g.n(4) {
			a = append(a, g.anyValue(depth+1))
		}
		return a
	}
	o := object{}
	for range g.n(4) {
		o = append(o, member{g.oneOf("a", "b", "text", "type", "content", "role", "x y", "input"), g.anyValue(depth + 1)})
	}
	return o
}

// obj shuffles the members and sometimes repeats a key with another value.
func (g *gen) obj(ms ...member) object {
	o := object(ms)
	if g.chance(0.7) {
		g.r.Shuffle(len(o), func(i, j int) { o[i], o[j] = o[j], o[i] })
	}
	if len(o) > 0 && g.chance(0.03) {
		dup := member{o[g.n(len(o))].k, g.anyValue(2)}
		at := g.n(len(o) + 1)
		o = append(o[:at], append(object{dup}, o[at:]...)...)
	}
	return o
}

func (g *gen) textPart() object {
	ms := []member{{"type", g.oneOf("text", "input_text", "output_text")}, {"text", g.str()}}
	if g.chance(0.2) {
		ms = append(ms, member{"cache_control", object{{"type", "ephemeral"}}})
	}
	return g.obj(ms...)
}

func (g *gen) media() object {
	switch g.n(4) {
	case 0:
		return g.obj(member{"type", "image_url"}, member{"image_url", g.obj(member{"url", "data:image/png;base64," + g.str()}, member{"detail", "low"})})
	case 1:
		return g.obj(member{"type", "image"}, member{"source", g.obj(member{"type", "base64"}, member{"media_type", "image/png"}, member{"data", g.str()})})
	case 2:
		return g.obj(member{"type", "input_audio"}, member{"input_audio", g.obj(member{"data", g.str()}, member{"format", "wav"})})
	default:
		return g.obj(member{"type", g.oneOf("document", "file", "input_file", "refusal")}, member{"source", g.anyValue(1)})
	}
}

func (g *gen) block() any {
	switch g.n(6) {
	case 0, 1:
		return g.obj(member{"type", "text"}, member{"text", g.str()})
	case 2:
		return g.media()
	case 3:
		return g.obj(member{"type", "text"}, member{"text", g.anyValue(1)})
	case 4:
		return g.scalar()
	default:
		return g.obj(member{"type", g.oneOf("text", "image")})
	}
}

func (g *gen) toolResult() object {
	ms := []member{{"type", "tool_result"}, {"tool_use_id", "toolu_" + g.str()}}
	switch g.n(5) {
	case 0, 1:
		ms = append(ms, member{"content", g.str()})
	case 2:
		blocks := []any{}
		for range g.n(4) {
			blocks = append(blocks, g.block())
		}
		ms = append(ms, member{"content", blocks})
	case 3:
		ms = append(ms, member{"content", g.anyValue(1)})
	}
	if g.chance(0.2) {
		ms = append(ms, member{"is_error", g.chance(0.5)})
	}
	return g.obj(ms...)
}

func (g *gen) toolUse() object {
	ms := []member{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", g.oneOf("calc", "search")}}
	if g.chance(0.85) {
		ms = append(ms, member{"input", g.anyValue(0)})
	}
	return g.obj(ms...)
}

func (g *gen) part() any {
	switch g.n(12) {
	case 0, 1, 2:
		return g.textPart()
	case 3:
		return g.media()
	case 4:
		return g.toolUse()
	case 5, 6:
		return g.toolResult()
	case 7:
		return g.str()
	case 8:
		return g.scalar()
	case 9:
		return g.obj(member{"type", "text"}, member{"text", g.anyValue(1)})
	case 10:
		return g.anyValue(0)
	default:
		return g.obj(member{"type", g.anyValue(1)}, member{"content", g.anyValue(1)})
	}
}

func (g *gen) content() any {
	switch g.n(8) {
	case 0, 1, 2:
		return g.str()
	case 3, 4, 5:
		parts := []any{}
		for range g.n(5) {
			parts = append(parts, g.part())
		}
		return parts
	case 6:
		return nil
	default:
		return g.anyValue(1)
	}
}

func (g *gen) toolCall() any {
	switch g.n(6) {
	case 0, 1, 2:
		var args any = g.str()
		if g.chance(0.3) {
			args = g.anyValue(0)
		}
		return g.obj(member{"id", "call_1"}, member{"type", "function"},
			member{"function", g.obj(member{"name", "f"}, member{"arguments", args})})
	case 3:
		return g.obj(member{"id", "call_2"}, member{"function", g.obj(member{"name", "f"})})
	case 4:
		return g.obj(member{"id", "call_3"}, member{"function", g.anyValue(1)})
	default:
		return g.scalar()
	}
}

func (g *gen) message() any {
	if g.chance(0.05) {
		return g.anyValue(0)
	}
	var ms []member
	if g.chance(0.92) {
		var role any = g.oneOf("user", "assistant", "system", "tool", "developer")
		if g.chance(0.05) {
			role = g.scalar()
		}
		ms = append(ms, member{"role", role})
	}
	if g.chance(0.88) {
		ms = append(ms, member{"content", g.content()})
	}
	if g.chance(0.1) {
		calls := []any{}
		for range g.n(3) {
			calls = append(calls, g.toolCall())
		}
		ms = append(ms, member{"tool_calls", calls})
	} else if g.chance(0.03) {
		ms = append(ms, member{"tool_calls", g.anyValue(1)})
	}
	if g.chance(0.1) {
		ms = append(ms, member{"name", g.str()})
	}
	if g.chance(0.05) {
		ms = append(ms, member{"output", g.anyValue(0)})
	}
	if g.chance(0.05) {
		ms = append(ms, member{"arguments", g.anyValue(0)})
	}
	if g.chance(0.05) {
		ms = append(ms, member{"type", g.oneOf("message", "reasoning", "mcp_call", "function_call")})
	}
	return g.obj(ms...)
}

func (g *gen) responsesItem() any {
	switch g.n(9) {
	case 0, 1:
		parts := []any{}
		for range 1 + g.n(3) {
			parts = append(parts, g.obj(member{"type", "input_text"}, member{"text", g.str()}))
		}
		return g.obj(member{"type", "message"}, member{"role", g.oneOf("user", "assistant")}, member{"content", parts})
	case 2:
		return g.obj(member{"type", "function_call"}, member{"call_id", "c1"}, member{"name", "f"}, member{"arguments", g.str()})
	case 3:
		return g.obj(member{"type", "function_call_output"}, member{"call_id", "c1"}, member{"output", g.str()})
	case 4:
		return g.obj(member{"type", "reasoning"}, member{"id", "rs_1"},
			member{"summary", []any{g.obj(member{"type", "summary_text"}, member{"text", g.str()})}})
	case 5:
		return g.obj(member{"type", "item_reference"}, member{"id", "msg_1"})
	case 6:
		return g.obj(member{"type", "mcp_call"}, member{"arguments", g.str()}, member{"output", g.str()})
	case 7:
		return g.obj(member{"type", "image_generation_call"}, member{"id", "ig_1"}, member{"result", g.str()})
	default:
		return g.message()
	}
}

func (g *gen) list(k int, f func() any) []any {
	a := []any{}
	for range g.n(k + 1) {
		a = append(a, f())
	}
	return a
}

func (g *gen) promptValue() any {
	switch g.n(7) {
	case 0, 1:
		return g.str()
	case 2:
		return g.list(3, func() any { return g.str() })
	case 3:
		return []any{json.Number("1"), json.Number("2"), json.Number("3")}
	case 4:
		return []any{[]any{json.Number("1"), json.Number("2")}}
	case 5:
		return g.list(3, g.part)
	default:
		return g.anyValue(0)
	}
}

// MarshalJSON writes the members in order, so test bodies can be built with
// encoding/json and keep the field order clients use.
func (o object) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		k, err := json.Marshal(m.k)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.v)
		if err != nil {
			return nil, err
		}
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(v)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// tree returns the body of a request to path.
func (g *gen) tree(path string) object {
	ms := []member{{"model", g.oneOf("gpt-x", "claude-y", "llama")}}
	if g.chance(0.5) {
		ms = append(ms, member{"temperature", g.number()})
	}
	if g.chance(0.3) {
		ms = append(ms, member{"stream", g.chance(0.5)})
	}
	if g.chance(0.3) {
		ms = append(ms, member{"tools", g.list(2, func() any { return g.anyValue(0) })})
	}
	body := g.chance(0.95)
	weird := g.chance(0.04)
	switch path {
	case affinity.PathChatCompletions:
		if body {
			v := any(g.list(6, g.message))
			if weird {
				v = g.anyValue(0)
			}
			ms = append(ms, member{"messages", v})
		}
	case affinity.PathMessages:
		if g.chance(0.5) {
			var sys any = g.str()
			switch g.n(5) {
			case 0:
				sys = g.list(3, func() any { return g.textPart() })
			case 1:
				sys = g.anyValue(0)
			}
			ms = append(ms, member{"system", sys})
		}
		if body {
			v := any(g.list(6, g.message))
			if weird {
				v = g.anyValue(0)
			}
			ms = append(ms, member{"messages", v})
		}
	case affinity.PathResponses:
		if g.chance(0.5) {
			var ins any = g.str()
			if g.chance(0.1) {
				ins = g.anyValue(0)
			}
			ms = append(ms, member{"instructions", ins})
		}
		if body {
			var v any = g.list(6, g.responsesItem)
			if g.chance(0.3) {
				v = g.str()
			} else if weird {
				v = g.anyValue(0)
			}
			ms = append(ms, member{"input", v})
		}
	case affinity.PathCompletions:
		if body {
			ms = append(ms, member{"prompt", g.promptValue()})
		}
	default:
		if body {
			ms = append(ms, member{"input", g.promptValue()})
		}
	}
	return g.obj(ms...)
}

// body writes a random request body for path.
func (g *gen) body(path string) []byte {
	w := writer{r: g.r, pretty: g.chance(0.2), escapes: g.r.Float64() * 0.2}
	w.value(g.tree(path))
	return w.buf.Bytes()
}

// writer serializes a tree as valid JSON with random whitespace and escapes.
type writer struct {
	r       *rand.Rand
	buf     bytes.Buffer
	pretty  bool    // whitespace between tokens
	escapes float64 // chance to \u-escape a character that needs no escape
}

func (w *writer) space() {
	if !w.pretty {
		return
	}
	switch w.r.IntN(6) {
	case 0:
		w.buf.WriteByte(' ')
	case 1:
		w.buf.WriteString("\n  ")
	case 2:
		w.buf.WriteString("\t\r\n")
	}
}

func (w *writer) value(v any) {
	w.space()
	switch v := v.(type) {
	case nil:
		w.buf.WriteString("null")
	case bool:
		fmt.Fprint(&w.buf, v)
	case json.Number:
		w.buf.WriteString(string(v))
	case string:
		w.str(v)
	case []any:
		w.buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				w.space()
				w.buf.WriteByte(',')
			}
			w.value(e)
		}
		w.space()
		w.buf.WriteByte(']')
	case object:
		w.buf.WriteByte('{')
		for i, m := range v {
			if i > 0 {
				w.buf.WriteByte(',')
			}
			w.space()
			w.str(m.k)
			w.space()
			w.buf.WriteByte(':')
			w.value(m.v)
		}
		w.space()
		w.buf.WriteByte('}')
	default:
		panic(fmt.Sprintf("unexpected %T", v))
	}
	w.space()
}

func (w *writer) str(s string) {
	w.buf.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			w.buf.WriteByte(s[i]) // keep invalid bytes raw
			i++
			continue
		}
		i += size
		if w.r.Float64() < w.escapes/10 {
			// A lone surrogate: decodes to U+FFFD on both sides.
			w.buf.WriteString(w.oneOf(`\ud800`, `\uDC00`, `\udbff`))
		}
		switch {
		case r == '"' && w.r.IntN(4) > 0:
			w.buf.WriteString(`\"`)
		case r == '\\' && w.r.IntN(4) > 0:
			w.buf.WriteString(`\\`)
		case r == '/' && w.r.IntN(3) == 0:
			w.buf.WriteString(`\/`)
		case r == '\n' && w.r.IntN(4) > 0:
			w.buf.WriteString(`\n`)
		case r == '\t' && w.r.IntN(4) > 0:
			w.buf.WriteString(`\t`)
		case r == '\r' && w.r.IntN(4) > 0:
			w.buf.WriteString(`\r`)
		case r < 0x20 || r == '"' || r == '\\' || w.r.Float64() < w.escapes:
			w.escape(r)
		default:
			w.buf.WriteRune(r)
		}
	}
	w.buf.WriteByte('"')
}

func (w *writer) oneOf(s ...string) string { return s[w.r.IntN(len(s))] }

func (w *writer) escape(r rune) {
	format := `\u%04x`
	if w.r.IntN(2) == 0 {
		format = `\u%04X`
	}
	if r >= 0x10000 {
		r -= 0x10000
		fmt.Fprintf(&w.buf, format, 0xD800+(r>>10))
		fmt.Fprintf(&w.buf, format, 0xDC00+(r&0x3FF))
		return
	}
	fmt.Fprintf(&w.buf, format, r)
}
