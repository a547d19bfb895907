package delivery

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Headers that report guardrail matches. Their values are rule names,
// comma-separated, never matched text.
const (
	HeaderGuardrailMatched  = "X-Rolter-Guardrail-Matched"
	HeaderGuardrailRedacted = "X-Rolter-Guardrail-Redacted"
)

// rule is a compiled guardrail rule.
type rule struct {
	name          string
	det           detector
	action        string
	replacement   string
	includeSystem bool
	toolCalls     bool
}

// guard holds the compiled rules of one stage.
type guard struct {
	rules   []rule
	maxScan int
	// toolCalls: some rule scans tool calls (only then are they read,
	// so that they spend no scan budget otherwise).
	toolCalls bool
}

// compileGuards compiles the rules of a validated config into the pre_call
// and post_call guards; a stage without rules is nil.
func compileGuards(c *GuardrailsConfig) (pre, post *guard, err error) {
	if !c.Enabled {
		return nil, nil, nil
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		cr := rule{name: r.Name, action: r.Action, replacement: r.Replacement, includeSystem: r.IncludeSystem, toolCalls: r.ToolCalls}
		var def string
		if r.Builtin != "" {
			cr.det, def = builtinDetector(r.Builtin)
			if cr.det == nil {
				return nil, nil, fmt.Errorf("guardrails.rules[%d].builtin: unknown detector %q", i, r.Builtin)
			}
		} else {
			re, err := regexp.Compile(r.Pattern)
			if err != nil {
				return nil, nil, fmt.Errorf("guardrails.rules[%d].pattern: invalid regexp: %w", i, err)
			}
			cr.det, def = reDetector{re: re}, DefaultPatternRedaction
		}
		if cr.replacement == "" {
			cr.replacement = def
		}
		g := &post
		if r.Stage == StagePreCall {
			g = &pre
		}
		if *g == nil {
			*g = &guard{maxScan: c.MaxScanBytes}
		}
		(*g).rules = append((*g).rules, cr)
		(*g).toolCalls = (*g).toolCalls || cr.toolCalls
	}
	return pre, post, nil
}

// textKind is what a text under scan is, which decides the rules that
// read it.
type textKind uint8

const (
	conversation textKind = iota // every rule of the stage
	instruction                  // a system or developer turn: include_system rules
	toolCall                     // a call the model makes: tool_calls rules, never redacted
)

// scanText is one text under scan: the window that is scanned (the part
// within the scan budget) and the tail past it, which is kept as it is.
type scanText struct {
	window, tail string
	kind         textKind
	unescaped    *string // a tool call's window with its JSON escapes decoded, once asked
}

// matches reports whether r finds something in t. A tool call is JSON
// text, whose strings may spell a character as an escape ("\u0040" for
// "@"), which the tool decodes and a pattern would not see: it is matched
// as written and with its escapes decoded.
func (t *scanText) matches(r *rule) bool {
	if len(r.det.find(t.window)) > 0 {
		return true
	}
	if t.kind != toolCall || !strings.Contains(t.window, `\`) {
		return false
	}
	if t.unescaped == nil {
		u := unescapeJSON(t.window)
		t.unescaped = &u
	}
	return len(r.det.find(*t.unescaped)) > 0
}

// unescapeJSON decodes the escapes of JSON strings wherever they are in s
// (a window may cut a document anywhere): \uXXXX (surrogate pairs joined,
// a lone surrogate as U+FFFD), \n, \t, \", \\ and the rest; a backslash
// that starts no escape is kept.
func unescapeJSON(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		switch e := s[i+1]; e {
		case 'u':
			r, n := decodeU(s[i:])
			if n == 0 {
				b.WriteByte(c)
				continue
			}
			b.WriteRune(r)
			i += n - 1
		default:
			d, ok := jsonEscapes[e]
			if !ok {
				b.WriteByte(c)
				continue
			}
			b.WriteByte(d)
			i++
		}
	}
	return b.String()
}

// jsonEscapes are JSON's one-character escapes, by the letter after the
// backslash.
var jsonEscapes = map[byte]byte{'n': '\n', 't': '\t', 'r': '\r', 'b': '\b', 'f': '\f', '"': '"', '\\': '\\', '/': '/'}

// decodeU decodes the \uXXXX escape (or surrogate pair) s starts with and
// returns the rune and the bytes it took, or 0 bytes when s starts no
// such escape.
func decodeU(s string) (rune, int) {
	hex := func(s string) (rune, bool) {
		if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(s[2:6], 16, 16)
		return rune(v), err == nil
	}
	r, ok := hex(s)
	if !ok {
		return 0, 0
	}
	if utf16.IsSurrogate(r) {
		if r2, ok := hex(s[6:]); ok && r < 0xdc00 {
			if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
				return d, 12
			}
		}
		return utf8.RuneError, 6
	}
	return r, 6
}

// verdict is the outcome of running a guard over a set of texts.
type verdict struct {
	blocked   string   // the first block rule that matched, or ""
	matched   []string // annotate rules that matched
	redacted  []string // redact rules that changed some text
	changed   []bool   // per text: rewritten by a redaction
	truncated bool     // some text lay past max_scan_bytes, or past the texts parseText records
}

// windows splits texts into scanned windows and tails within the budget,
// cutting on a UTF-8 boundary.
func (g *guard) windows(texts []string, kinds []textKind) ([]scanText, bool) {
	out := make([]scanText, len(texts))
	budget, truncated := g.maxScan, false
	for i, t := range texts {
		n := min(len(t), budget)
		for n > 0 && n < len(t) && !utf8.RuneStart(t[n]) {
			n--
		}
		if n < len(t) {
			truncated = true
		}
		budget -= n
		out[i] = scanText{window: t[:n], tail: t[n:]}
		if kinds != nil {
			out[i].kind = kinds[i]
		}
	}
	return out, truncated
}

// run applies the guard to texts (rewriting them for redact rules).
// Block and annotate rules are matched against the original text; redact
// rules are applied in order, each to the output of the previous. A block
// decides alone: nothing is redacted then.
func (g *guard) run(texts []string, kinds []textKind) verdict {
	win, truncated := g.windows(texts, kinds)
	v := verdict{changed: make([]bool, len(texts)), truncated: truncated}
	applies := func(r *rule, t *scanText) bool {
		switch t.kind {
		case instruction:
			return r.includeSystem
		case toolCall:
			return r.toolCalls && r.action != ActionRedact
		}
		return true
	}
	for i := range g.rules {
		r := &g.rules[i]
		if r.action == ActionRedact {
			continue
		}
		for j := range win {
			if applies(r, &win[j]) && win[j].matches(r) {
				if r.action == ActionBlock {
					if v.blocked == "" {
						v.blocked = r.name
					}
				} else {
					v.matched = append(v.matched, r.name)
				}
				break
			}
		}
	}
	if v.blocked != "" {
		return v
	}
	for i := range g.rules {
		r := &g.rules[i]
		if r.action != ActionRedact {
			continue
		}
		hit := false
		for j := range win {
			t := &win[j]
			if !applies(r, t) {
				continue
			}
			ms := r.det.find(t.window)
			if len(ms) == 0 {
				continue
			}
			var b strings.Builder
			last := 0
			for _, m := range ms {
				b.WriteString(t.window[last:m[0]])
				b.WriteString(r.replacement)
				last = m[1]
			}
			b.WriteString(t.window[last:])
			t.window = b.String()
			v.changed[j], hit = true, true
		}
		if hit {
			v.redacted = append(v.redacted, r.name)
		}
	}
	for j := range win {
		if v.changed[j] {
			texts[j] = win[j].window + win[j].tail
		}
	}
	return v
}

// annotate adds the verdict's rule names to h.
func (v *verdict) annotate(h http.Header) {
	if len(v.matched) > 0 {
		h.Set(HeaderGuardrailMatched, strings.Join(v.matched, ", "))
	}
	if len(v.redacted) > 0 {
		h.Set(HeaderGuardrailRedacted, strings.Join(v.redacted, ", "))
	}
}

// rewrite applies a guard to the chosen leaves of doc and returns the
// verdict and the body with the changed strings spliced in (body itself
// when nothing changed).
func (g *guard) rewrite(body []byte, doc *textDoc, idx []int, kinds []textKind) (verdict, []byte) {
	texts := doc.values(idx)
	v := g.run(texts, kinds)
	v.truncated = v.truncated || doc.truncated
	return v, spliceTexts(body, doc, idx, texts)
}
