// Package layout_test guards the repository's architecture: which module
// may import which, that production code never imports testing, and that
// the Markdown's relative links and anchors resolve.
package layout_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// deps lists every package the production code of module depends on.
func deps(t *testing.T, module string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...")
	cmd.Dir = filepath.Join("..", "..", module)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", module, err, out)
	}
	return strings.Fields(string(out))
}

func TestModuleBoundaries(t *testing.T) {
	rules := []struct {
		module    string
		forbidden []string
	}{
		{"pkg", []string{"rolter.dev/dataplane", "rolter.dev/controlplane", "rolter.dev/kvwatcher", "rolter.dev/tests", "testing"}},
		{"dataplane", []string{"rolter.dev/controlplane", "rolter.dev/kvwatcher", "rolter.dev/tests", "testing"}},
		{"controlplane", []string{"rolter.dev/dataplane", "rolter.dev/kvwatcher", "rolter.dev/tests", "testing"}},
		{"kvwatcher", []string{"rolter.dev/dataplane", "rolter.dev/controlplane", "rolter.dev/tests", "testing"}},
	}
	for _, r := range rules {
		t.Run(r.module, func(t *testing.T) {
			for _, d := range deps(t, r.module) {
				for _, f := range r.forbidden {
					if d == f || strings.HasPrefix(d, f+"/") {
						t.Errorf("%s depends on %s (forbidden)", r.module, d)
					}
				}
			}
		})
	}
}
