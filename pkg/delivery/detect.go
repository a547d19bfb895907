package delivery

import (
	"regexp"
	"strings"
)

// A detector finds the non-overlapping matches of a rule in a text, in
// order, as [start, end) byte ranges.
type detector interface {
	find(s string) [][2]int
}

// reDetector is a regexp whose candidate matches are confirmed by check. A
// rejected candidate is skipped as a whole, so scanning stays linear. When
// class is set, the regexp only runs inside maximal runs of bytes of that
// class that keep accepts: every byte a match can contain is in the class,
// so no match is lost, and prose without candidates costs one table scan.
type reDetector struct {
	re    *regexp.Regexp
	check func(s string, start, end int) bool
	class *byteClass
	keep  func(run string) bool
}

// byteClass is a set of bytes.
type byteClass [256]bool

// newClass builds a class from ranges ("a-z") and sets of bytes ("._").
func newClass(ranges ...string) *byteClass {
	var c byteClass
	for _, r := range ranges {
		if len(r) == 3 && r[1] == '-' && isAlnum(r[0]) && isAlnum(r[2]) {
			for b := int(r[0]); b <= int(r[2]); b++ {
				c[b] = true
			}
			continue
		}
		for i := 0; i < len(r); i++ {
			c[r[i]] = true
		}
	}
	return &c
}

func (d reDetector) find(s string) [][2]int {
	if d.class == nil {
		return d.findIn(s, 0, len(s), nil)
	}
	var out [][2]int
	for i := 0; i < len(s); {
		if !d.class[s[i]] {
			i++
			continue
		}
		j := i + 1
		for j < len(s) && d.class[s[j]] {
			j++
		}
		if d.keep == nil || d.keep(s[i:j]) {
			out = d.findIn(s, i, j, out)
		}
		i = j
	}
	return out
}

// findIn appends the confirmed matches inside s[from:to].
func (d reDetector) findIn(s string, from, to int, out [][2]int) [][2]int {
	for off := from; off < to; {
		m := d.re.FindStringIndex(s[off:to])
		if m == nil {
			break
		}
		start, end := off+m[0], off+m[1]
		if end == start {
			// An empty match (a pattern rule like `a*`): step over one byte.
			off = end + 1
			continue
		}
		if d.check == nil || d.check(s, start, end) {
			out = append(out, [2]int{start, end})
		}
		off = end
	}
	return out
}

// minDigits keeps runs with at least n digits.
func minDigits(n int) func(string) bool {
	return func(run string) bool {
		c := 0
		for i := 0; i < len(run); i++ {
			if isDigit(run[i]) {
				if c++; c >= n {
					return true
				}
			}
		}
		return false
	}
}

// builtinDetector returns the detector and default replacement of a
// built-in rule.
func builtinDetector(name string) (detector, string) {
	switch name {
	case BuiltinEmail:
		return reDetector{re: emailRE, check: emailCheck, class: emailClass,
			keep: func(run string) bool { return strings.IndexByte(run, '@') > 0 }}, "[REDACTED:EMAIL]"
	case BuiltinPhone:
		return reDetector{re: phoneRE, check: phoneCheck, class: phoneClass, keep: minDigits(8)}, "[REDACTED:PHONE]"
	case BuiltinAPIToken:
		return reDetector{re: tokenRE, check: tokenCheck, class: tokenClass,
			keep: func(run string) bool { return len(run) >= 15 }}, "[REDACTED:API_TOKEN]"
	case BuiltinPaymentCard:
		return reDetector{re: cardRE, check: cardCheck, class: cardClass, keep: minDigits(13)}, "[REDACTED:CARD]"
	}
	return nil, ""
}

// The byte classes of the builtins: every byte their regexps can match.
var (
	emailClass = newClass("a-z", "A-Z", "0-9", "._%+-@")
	phoneClass = newClass("0-9", " .-()+")
	tokenClass = newClass("a-z", "A-Z", "0-9", "_-.")
	cardClass  = newClass("0-9", " -")
)

var (
	// emailRE: a local part, "@", dot-separated labels and a 2–24 letter
	// top-level domain. "user@localhost" and "a@b.c" do not match.
	emailRE = regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}`)

	// phoneRE finds candidates: an optional +country code, an optional
	// (area code), then digit groups with optional single separators.
	// phoneCheck decides.
	phoneRE = regexp.MustCompile(`(?:\+\d{1,3}[ .\-]?)?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){1,5}`)

	// tokenRE: credentials with a recognisable shape: OpenAI / Anthropic /
	// rolter "sk-", Stripe, GitHub, GitLab, Hugging Face, Slack, Google API
	// keys, AWS access key ids and JSON web tokens.
	tokenRE = regexp.MustCompile(`(?:` +
		`sk-[A-Za-z0-9_\-]{20,}` +
		`|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}` +
		`|gh[pousr]_[A-Za-z0-9]{36,}` +
		`|github_pat_[A-Za-z0-9_]{22,}` +
		`|glpat-[A-Za-z0-9_\-]{20,}` +
		`|hf_[A-Za-z0-9]{30,}` +
		`|xox[abposr]-[A-Za-z0-9\-]{10,}` +
		`|AIza[0-9A-Za-z_\-]{35}` +
		`|(?:AKIA|ASIA)[0-9A-Z]{16}` +
		`|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}` +
		`)`)

	// cardRE: 13 to 19 digits starting with 2–6 (the major networks),
	// optionally grouped by single spaces or dashes. cardCheck applies the
	// Luhn check.
	cardRE = regexp.MustCompile(`[2-6](?:[ \-]?\d){12,18}`)
)

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isAlnum(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isSep(c byte) bool { return c == ' ' || c == '.' || c == '-' }

// digitRunAround reports whether the match continues a longer run of
// digits: a digit right before or after it, or one behind a single
// separator.
func digitRunAround(s string, start, end int) bool {
	if start > 0 && (isDigit(s[start-1]) || start > 1 && isSep(s[start-1]) && isDigit(s[start-2])) {
		return true
	}
	if end < len(s) && (isDigit(s[end]) || end+1 < len(s) && isSep(s[end]) && isDigit(s[end+1])) {
		return true
	}
	return false
}

func emailCheck(s string, start, end int) bool {
	// The TLD must not run on into more letters or digits (the regexp
	// stops at 24 letters) and the local part must start the word.
	if end < len(s) && isAlnum(s[end]) {
		return false
	}
	return !strings.HasPrefix(s[start:end], ".")
}

// phoneCheck accepts international numbers written with a leading "+"
// (8–15 digits) and national numbers of 10–12 digits written with at
// least one separator or a parenthesised area code, that are not part of
// a longer digit sequence. Bare digit runs (ids, timestamps), dates,
// social security numbers and IPv4 addresses are not phones.
func phoneCheck(s string, start, end int) bool {
	m := s[start:end]
	if digitRunAround(s, start, end) || start > 0 && (isAlnum(s[start-1]) || s[start-1] == '+') {
		return false
	}
	if end < len(s) && isAlnum(s[end]) {
		return false
	}
	if strings.Count(m, ".") == 3 && strings.Trim(m, "0123456789.") == "" {
		return false // a dotted quad: an IPv4 address
	}
	digits := 0
	for i := 0; i < len(m); i++ {
		if isDigit(m[i]) {
			digits++
		}
	}
	seps := len(m) - digits
	if strings.HasPrefix(m, "+") {
		return digits >= 8 && digits <= 15
	}
	return seps > 0 && digits >= 10 && digits <= 12
}

// tokenCheck rejects matches glued to a longer word and, for the loosely
// shaped families, matches that are not random-looking (a word like
// "sk-some-very-long-hyphenated-phrase" has no digit).
func tokenCheck(s string, start, end int) bool {
	isTokenByte := func(c byte) bool { return isAlnum(c) || c == '_' || c == '-' }
	if start > 0 && isTokenByte(s[start-1]) || end < len(s) && isTokenByte(s[end]) {
		return false
	}
	m := s[start:end]
	return strings.ContainsAny(m, "0123456789") &&
		strings.ContainsAny(m, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
}

// cardCheck accepts a digit sequence that stands alone and passes the Luhn
// check.
func cardCheck(s string, start, end int) bool {
	if digitRunAround(s, start, end) || start > 0 && isAlnum(s[start-1]) || end < len(s) && isAlnum(s[end]) {
		return false
	}
	return luhn(s[start:end])
}

// luhn runs the Luhn checksum over the digits of s, ignoring separators.
func luhn(s string) bool {
	sum, n := 0, 0
	for i := len(s) - 1; i >= 0; i-- {
		c := s[i]
		if !isDigit(c) {
			continue
		}
		d := int(c - '0')
		if n%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
		n++
	}
	return n > 0 && sum%10 == 0
}
