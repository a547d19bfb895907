package delivery

import (
	"fmt"
	"net/http"
	"regexp"
	"rolter.dev/pkg/jsonesc"
	"strings"
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
// (a window may cut a document anywhere), as jsonesc.Decode reads them; a
// backslash that starts no escape is kept.
func unescapeJSON(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			i++
			continue
		}
		r, next := jsonesc.Decode(s, i)
		if next < 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteRune(r)
		i = next
	}
	return b.String()
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
