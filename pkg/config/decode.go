package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// Parse decodes a TOML document strictly on top of [Default], applies the
// list-element defaults and returns the Config. It does not validate: call
// [Config.Validate] (or use [Load], which does both).
//
// Every unknown key and every value of the wrong type is reported, each with
// its field path, joined into one error.
func Parse(data []byte) (*Config, error) {
	var tree map[string]any
	if err := toml.Unmarshal(data, &tree); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("config: line %d, column %d: %s", row, col, de.Error())
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	if errs := checkTree(tree, reflect.TypeFor[Config](), ""); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg := Default()
	dec := toml.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		// checkTree should have caught everything; this is the safety net.
		return nil, fmt.Errorf("config: %w", err)
	}
	applyDefaults(&cfg)
	return &cfg, nil
}

// Load reads, parses and validates a config file.
func Load(path string) (*Config, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, data, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, data, err
	}
	return cfg, data, nil
}

// FieldError is one problem at one field path.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

var timeType = reflect.TypeFor[time.Time]()

// checkTree walks the generic decode of a document against the Go type it
// will be decoded into and reports unknown keys and type mismatches with
// indexed paths, which the TOML decoder alone cannot give.
func checkTree(v any, t reflect.Type, path string) []error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	bad := func(want string) []error {
		return []error{&FieldError{Path: path, Msg: fmt.Sprintf("expected %s, got %s", want, tomlKind(v))}}
	}
	switch {
	case t == timeType:
		switch v.(type) {
		case time.Time, toml.LocalDateTime, toml.LocalDate:
			return nil
		}
		return bad("a date-time (e.g. 2027-01-01T00:00:00Z)")
	case t.Kind() == reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("a table")
		}
		fields := tomlFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var errs []error
		for _, k := range keys {
			p := joinPath(path, k)
			f, ok := fields[k]
			if !ok {
				errs = append(errs, &FieldError{Path: p, Msg: "unknown key" + suggest(k, fields)})
				continue
			}
			errs = append(errs, checkTree(m[k], f.Type, p)...)
		}
		return errs
	case t.Kind() == reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return bad("a table")
		}
		var errs []error
		for k, item := range m {
			errs = append(errs, checkTree(item, t.Elem(), joinPath(path, k))...)
		}
		return errs
	case t.Kind() == reflect.Slice:
		items, ok := v.([]any)
		if !ok {
			if maps, ok := v.([]map[string]any); ok {
				items = make([]any, len(maps))
				for i := range maps {
					items[i] = maps[i]
				}
			} else {
				return bad("an array")
			}
		}
		var errs []error
		for i, item := range items {
			errs = append(errs, checkTree(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
		return errs
	case t.Kind() == reflect.String:
		if _, ok := v.(string); !ok {
			return bad("a string")
		}
	case t.Kind() == reflect.Bool:
		if _, ok := v.(bool); !ok {
			return bad("a boolean")
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		n, ok := v.(int64)
		if !ok {
			return bad("an integer")
		}
		if reflect.New(t).Elem().OverflowInt(n) {
			return []error{&FieldError{Path: path, Msg: fmt.Sprintf("%d is out of range", n)}}
		}
	case t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32:
		switch v.(type) {
		case float64, int64:
		default:
			return bad("a number")
		}
	}
	return nil
}

func tomlFields(t reflect.Type) map[string]reflect.StructField {
	out := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f
	}
	return out
}

func suggest(k string, fields map[string]reflect.StructField) string {
	best, bestD := "", 3
	for name := range fields {
		if d := editDistance(k, name); d < bestD || (d == bestD && name < best) {
			best, bestD = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func joinPath(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

func tomlKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "an array"
	case time.Time, toml.LocalDate, toml.LocalDateTime, toml.LocalTime:
		return "a date-time"
	default:
		return fmt.Sprintf("%T", v)
	}
}
