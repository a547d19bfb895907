// Package promtext reads the few values rolter needs from a Prometheus text
// exposition (format 0.0.4, and the sample lines of OpenMetrics): the sum of
// every sample of a named metric, across its label sets ([Sum]), and the
// label sets of a named metric ([Labels], [Label]: info gauges such as
// vllm:cache_config_info carry their values in labels).
//
// It is not a general parser. It looks only at sample lines whose metric name
// is exactly one of the wanted names (so vllm:num_requests_running does not
// match vllm:num_requests_running_total), parses their label set only far
// enough to skip it, and their value. Comments (# HELP, # TYPE, # EOF), blank
// lines and every other metric are skipped without being validated, so an
// exposition rolter does not fully understand still yields the values it
// does. It allocates nothing.
package promtext

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Errors returned by [Sum]; they are wrapped with the line number.
var (
	ErrSyntax = errors.New("promtext: malformed sample")
	ErrValue  = errors.New("promtext: value is NaN, infinite or negative")
)

// Sum adds up, for each names[i], the values of every sample line of exactly
// that metric name into sums[i] and counts the lines into counts[i] (both
// are zeroed first; they must be at least len(names) long). A wanted sample
// that does not parse, or whose value is NaN, ±Inf or negative, is an error:
// the caller should not trust a partial sum. Names must be non-empty.
func Sum(data []byte, names []string, sums []float64, counts []int) error {
	for i := range names {
		sums[i], counts[i] = 0, 0
	}
	line := 0
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		l = trimSpace(l)
		if len(l) == 0 || l[0] == '#' {
			continue
		}
		want := -1
		for i, n := range names {
			if len(l) >= len(n) && string(l[:len(n)]) == n && (len(l) == len(n) || !nameByte(l[len(n)])) {
				want = i
				break
			}
		}
		if want < 0 {
			continue
		}
		v, err := sampleValue(l[len(names[want]):])
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", line, names[want], err)
		}
		sums[want] += v
		if math.IsInf(sums[want], 0) {
			return fmt.Errorf("line %d: %s: sum overflows: %w", line, names[want], ErrValue)
		}
		counts[want]++
	}
	return nil
}

// sampleValue parses what follows a sample's metric name: an optional label
// set, blanks, the value and an optional timestamp (ignored).
func sampleValue(rest []byte) (float64, error) {
	if len(rest) > 0 && rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return 0, ErrSyntax
		}
		rest = rest[end:]
	}
	if len(rest) == 0 || !blank(rest[0]) {
		return 0, ErrSyntax
	}
	value, rest := field(rest)
	if ts, after := field(rest); len(ts) > 0 && ts[0] != '#' {
		after = trimSpace(after)
		// A timestamp (milliseconds, or OpenMetrics' float seconds),
		// checked for shape only; then nothing but an exemplar.
		if _, err := strconv.ParseFloat(string(ts), 64); err != nil || (len(after) > 0 && after[0] != '#') {
			return 0, ErrSyntax
		}
	}
	v, err := strconv.ParseFloat(string(value), 64)
	if err != nil {
		return 0, ErrSyntax
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, ErrValue
	}
	return v, nil
}

// labelsEnd returns the index just past the '}' closing the label set that
// b starts with, honouring quoted values and their escapes, or -1.
func labelsEnd(b []byte) int {
	inQuote := false
	for i := 1; i < len(b); i++ {
		c := b[i]
		switch {
		case inQuote && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i + 1
		}
	}
	return -1
}

// nameByte reports whether c may continue a metric name.
func nameByte(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// field splits the first blank-separated field off b.
func field(b []byte) (f, rest []byte) {
	b = trimSpace(b)
	n := 0
	for n < len(b) && !blank(b[n]) {
		n++
	}
	return b[:n], b[n:]
}

func blank(c byte) bool { return c == ' ' || c == '\t' }

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (blank(b[0]) || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (blank(b[len(b)-1]) || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Check returns an error naming the first of names with no sample, as
// reported in counts by [Sum].
func Check(names []string, counts []int) error {
	for i, n := range names {
		if counts[i] == 0 {
			return fmt.Errorf("promtext: no sample of %s", n)
		}
	}
	return nil
}

// Labels calls fn with the label set (the text between the braces, escapes
// kept) of every sample line of exactly the metric name, in order, and
// returns fn's first error. A wanted line whose label set or value does not
// parse is an error, as in [Sum]. It allocates nothing.
func Labels(data []byte, name string, fn func(labels []byte) error) error {
	line := 0
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		l = trimSpace(l)
		if len(l) < len(name) || string(l[:len(name)]) != name || (len(l) > len(name) && nameByte(l[len(name)])) {
			continue
		}
		rest := l[len(name):]
		var set []byte
		if len(rest) > 0 && rest[0] == '{' {
			end := labelsEnd(rest)
			if end < 0 {
				return fmt.Errorf("line %d: %s: %w", line, name, ErrSyntax)
			}
			set = rest[1 : end-1]
		}
		if _, err := sampleValue(rest); err != nil {
			return fmt.Errorf("line %d: %s: %w", line, name, err)
		}
		if err := fn(set); err != nil {
			return err
		}
	}
	return nil
}

// Label returns the value of label key in a label set as [Labels] passes
// it (name="value" pairs separated by commas), still escaped, and whether
// the set has it.
func Label(labels []byte, key string) ([]byte, bool) {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 {
			return nil, false
		}
		k := bytes.TrimSpace(labels[:eq])
		rest := bytes.TrimLeft(labels[eq+1:], " \t")
		if len(rest) == 0 || rest[0] != '"' {
			return nil, false
		}
		end := -1
		for i := 1; i < len(rest); i++ {
			if rest[i] == '\\' {
				i++
				continue
			}
			if rest[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, false
		}
		if string(k) == key {
			return rest[1:end], true
		}
		labels = rest[end+1:]
	}
	return nil, false
}
