package layout_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLinkRe  = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRe = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	mdTextRe  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// slug is the anchor GitHub gives a heading: lower case, only letters,
// digits, '-', '_' and spaces kept, spaces turned into '-'.
func slug(heading string) string {
	heading = mdTextRe.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// prose returns the lines of a Markdown page with fenced code blanked, so
// line numbers stay true and code is not read as links or headings.
func prose(page string) []string {
	lines := strings.Split(page, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
		} else if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the heading anchors of a page, numbered as GitHub numbers
// repeated headings (x, x-1, x-2).
func anchors(page string) map[string]bool {
	out, seen := map[string]bool{}, map[string]int{}
	for _, l := range prose(page) {
		m := headingRe.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n, dup := seen[s]; dup {
			seen[s] = n + 1
			out[s+"-"+strconv.Itoa(n+1)] = true
		} else {
			seen[s] = 0
			out[s] = true
		}
	}
	return out
}

// TestDocLinks checks every relative link of the repository's Markdown: the
// file exists, and a #fragment into a Markdown page names one of its headings.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	cache := map[string]map[string]bool{}
	links := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for n, line := range prose(string(raw)) {
			for _, m := range mdLinkRe.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, frag, _ := strings.Cut(target, "#")
				dest := path
				if file != "" {
					dest = filepath.Join(filepath.Dir(path), file)
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %s: no such file", rel, n+1, target)
					continue
				}
				if frag == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if cache[dest] == nil {
					page, err := os.ReadFile(dest)
					if err != nil {
						return err
					}
					cache[dest] = anchors(string(page))
				}
				if !cache[dest][frag] {
					t.Errorf("%s:%d: link %s: no heading with that anchor", rel, n+1, target)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if links < 30 {
		t.Fatalf("found only %d relative links: has the pattern stopped matching?", links)
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Token ids for every client: the engine's `/tokenize` (issue 13)": "token-ids-for-every-client-the-engines-tokenize-issue-13",
		"`[routes.balancer]`, tuning":                                     "routesbalancer-tuning",
		"See [the docs](x.md) now":                                        "see-the-docs-now",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}
