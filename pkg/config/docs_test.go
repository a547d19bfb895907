package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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
