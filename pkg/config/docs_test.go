package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"rolter.dev/pkg/config"
)

// TestDocsCoverEveryKey keeps docs/configuration.md in step with the schema:
// every key path of Config must appear there in backticks.
func TestDocsCoverEveryKey(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	var walk func(reflect.Type, string)
	walk = func(rt reflect.Type, prefix string) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			if rt.Kind() == reflect.Slice {
				prefix += "[]"
			}
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || rt == reflect.TypeFor[time.Time]() {
			paths = append(paths, prefix)
			return
		}
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("toml"), ",")
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			walk(rt.Field(i).Type, p)
		}
	}
	walk(reflect.TypeFor[config.Config](), "")
	for _, p := range paths {
		// Arrays of scalars (models, providers) are documented without [].
		p = strings.TrimSuffix(p, "[]")
		if !strings.Contains(string(doc), "`"+p+"`") {
			t.Errorf("docs/configuration.md does not document `%s`", p)
		}
	}
}

var sectionRe = regexp.MustCompile(`^\[\[?[a-z_]+(\.[a-z_]+)*\]\]?$`)

// documentedKeys returns the keys of docs/configuration.md: the backticked
// names in the first column of its `| key | default | effect |` tables, and
// every backticked `[section]` / `[[array]]` / `[a.b]` name of the page.
func documentedKeys(doc string) (keys, sections []string) {
	inKeyTable := false
	for line := range strings.Lines(doc) {
		line = strings.TrimSpace(line)
		for _, tok := range backticked(line) {
			if sectionRe.MatchString(tok) {
				sections = append(sections, tok)
			}
		}
		if !strings.HasPrefix(line, "|") {
			inKeyTable = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		first := strings.TrimSpace(cells[0])
		switch {
		case first == "key":
			inKeyTable = true
		case !inKeyTable || strings.Trim(first, "-: ") == "":
		default:
			keys = append(keys, backticked(first)...)
		}
	}
	return keys, sections
}

// backticked returns the `quoted` spans of s.
func backticked(s string) []string {
	var out []string
	for {
		_, rest, ok := strings.Cut(s, "`")
		if !ok {
			return out
		}
		tok, after, ok := strings.Cut(rest, "`")
		if !ok {
			return out
		}
		out = append(out, tok)
		s = after
	}
}

// docTree builds the smallest document that sets the key path p
// (`routes[].targets[].weight`: an array of tables per `[]`), with value at
// the leaf.
func docTree(p string, value any) map[string]any {
	parts := strings.Split(p, ".")
	var build func(i int) any
	build = func(i int) any {
		if i == len(parts) {
			return value
		}
		name, isArray := strings.CutSuffix(parts[i], "[]")
		if isArray {
			return map[string]any{name: []any{build(i + 1)}}
		}
		return map[string]any{name: build(i + 1)}
	}
	return build(0).(map[string]any)
}

// TestDocsListOnlyKeys is the converse of TestDocsCoverEveryKey: every key
// and section docs/configuration.md documents is one the strict decoder
// accepts, so the page lists nothing else (no renamed or removed keys).
func TestDocsListOnlyKeys(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	keys, sections := documentedKeys(string(doc))
	if len(keys) < 50 || len(sections) < 5 {
		t.Fatalf("parsed only %d keys and %d sections from docs/configuration.md: has its table format changed?", len(keys), len(sections))
	}
	for _, bad := range rejectedKeys(t, keys, sections) {
		t.Errorf("docs/configuration.md documents %s", bad)
	}

	// The check itself catches a stray key, section and non-key.
	const stray = "## `[server]`, `[[nope]]`\n\n| key | default | effect |\n|---|---|---|\n" +
		"| `server.listen` | | |\n| `server.bogus` | | |\n| `routes[].targets[].wieght` | | |\n| `Not A Key` | | |\n\n| code | |\n| `server.other` | |\n"
	keys, sections = documentedKeys(stray)
	got := rejectedKeys(t, keys, sections)
	want := []string{"`server.bogus`", "`routes[].targets[].wieght`", "`Not A Key`", "`nope[]`"}
	if len(got) != len(want) {
		t.Fatalf("stray keys: got %q, want %d matching %q", got, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("stray keys: got %q, want %q first", got[i], want[i])
		}
	}
}

var keyPathRe = regexp.MustCompile(`^[a-z_]+(\[\])?(\.[a-z_]+(\[\])?)*$`)

// rejectedKeys returns the documented keys and sections the decoder rejects
// as unknown (or that are not key paths at all), with the reason.
func rejectedKeys(t *testing.T, keys, sections []string) []string {
	t.Helper()
	for _, s := range sections {
		name := strings.Trim(s, "[]")
		if strings.HasPrefix(s, "[[") {
			name += "[]"
		}
		keys = append(keys, name)
	}
	var bad []string
	for _, k := range keys {
		if !keyPathRe.MatchString(k) {
			bad = append(bad, "`"+k+"`, which is not a key path (a.b, a[].b)")
			continue
		}
		// The leaf's value may have the wrong type: only unknown keys matter.
		var tree map[string]any
		if base, ok := strings.CutSuffix(k, "[]"); ok {
			tree = docTree(base, []any{map[string]any{}})
		} else {
			tree = docTree(k, true)
		}
		data, err := toml.Marshal(tree)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		_, err = config.Parse(data)
		for _, e := range joined(err) {
			var fe *config.FieldError
			if errors.As(e, &fe) && strings.HasPrefix(fe.Msg, "unknown key") {
				bad = append(bad, "`"+k+"`, which the decoder rejects: "+fe.Error())
			}
		}
	}
	return bad
}

func joined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // walking a join
		return j.Unwrap()
	}
	return []error{err}
}

// proseKeyRe matches a backticked key path (`server.require_auth`,
// `routes[2].targets[0].provider`, `server.require_auth = false`) or section
// (`[routes.balancer]`, `[[providers]]`) anywhere in a page.
var proseKeyRe = regexp.MustCompile("`(\\[\\[?[a-z_.]+\\]\\]?|[a-z_]+(?:\\[\\d*\\])?(?:\\.[a-z_]+(?:\\[\\d*\\])?)+)(?: = [^`]*)?`")

// schemaHas reports whether the dotted key path (indices and `[]` ignored)
// names a field of rt, the way TOML nests it: through slices, pointers and
// maps (a map's keys are free).
func schemaHas(rt reflect.Type, path string) bool {
	for seg := range strings.SplitSeq(path, ".") {
		seg, _, _ = strings.Cut(seg, "[")
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			rt = rt.Elem()
		}
		switch rt.Kind() {
		case reflect.Map:
			rt = rt.Elem()
			continue
		case reflect.Struct:
		default:
			return false
		}
		found := false
		for i := range rt.NumField() {
			if name, _, _ := strings.Cut(rt.Field(i).Tag.Get("toml"), ","); name == seg {
				rt, found = rt.Field(i).Type, true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestProseNamesOnlyKeys checks the key paths the README and every docs page
// name in prose (not only configuration.md's tables): each one whose first
// segment is a top-level key of Config must exist, so a renamed or removed
// key does not live on in a how-to.
func TestProseNamesOnlyKeys(t *testing.T) {
	root := filepath.Join("..", "..")
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	top := map[string]bool{}
	cfg := reflect.TypeFor[config.Config]()
	for i := range cfg.NumField() {
		name, _, _ := strings.Cut(cfg.Field(i).Tag.Get("toml"), ",")
		top[name] = true
	}
	checked := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range proseKeyRe.FindAllStringSubmatch(string(raw), -1) {
			key := strings.Trim(m[1], "[]")
			first, _, _ := strings.Cut(strings.SplitN(key, ".", 2)[0], "[")
			if !top[first] {
				continue
			}
			checked++
			if !schemaHas(cfg, key) {
				t.Errorf("%s names `%s`, which is not a config key", filepath.Base(page), m[1])
			}
		}
	}
	if checked < 100 {
		t.Fatalf("found only %d key paths in the docs: has the pattern stopped matching?", checked)
	}
	// The check itself rejects a misspelt leaf and section and accepts a map's key.
	for path, want := range map[string]bool{"routes.balancer.scorers.prefix": true, "routes[0].targets[1].weight": true, "server.require_auht": false, "routes.balancr": false} {
		if got := schemaHas(cfg, path); got != want {
			t.Errorf("schemaHas(%q) = %v, want %v", path, got, want)
		}
	}
}
