package state

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

var timeType = reflect.TypeFor[time.Time]()

// Tree converts a config value (a struct with toml tags, or anything made
// of them) into the generic tree the TOML encoder writes: tables as
// map[string]any, arrays as []any, times as time.Time. Nil pointers, nil
// maps, nil slices and empty arrays of tables are left out; every other
// field is written, zero or not, so that decoding the tree on top of
// [config.Default] gives back the same value. So is an empty but non-nil
// array of scalars: `server.cors.allowed_origins = []` (CORS off) differs
// from an absent key, whose default is ["*"].
func Tree(v any) any {
	t, _ := tree(reflect.ValueOf(v))
	return t
}

func tree(v reflect.Value) (any, bool) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil, false
		}
		v = v.Elem()
	}
	if v.Type() == timeType {
		return v.Interface().(time.Time), true
	}
	switch v.Kind() {
	case reflect.Struct:
		m := make(map[string]any, v.NumField())
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			if x, ok := tree(v.Field(i)); ok {
				m[name] = x
			}
		}
		return m, true
	case reflect.Map:
		if v.IsNil() || v.Len() == 0 {
			return nil, false
		}
		m := make(map[string]any, v.Len())
		it := v.MapRange()
		for it.Next() {
			if x, ok := tree(it.Value()); ok {
				m[fmt.Sprint(it.Key().Interface())] = x
			}
		}
		return m, true
	case reflect.Slice, reflect.Array:
		if v.Len() == 0 {
			if v.Kind() == reflect.Slice && !v.IsNil() && !tables(v.Type().Elem()) {
				return []any{}, true
			}
			return nil, false
		}
		out := make([]any, 0, v.Len())
		for i := range v.Len() {
			if x, ok := tree(v.Index(i)); ok {
				out = append(out, x)
			}
		}
		return out, true
	case reflect.String:
		return v.String(), true
	case reflect.Bool:
		return v.Bool(), true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(v.Uint()), true
	case reflect.Float32, reflect.Float64:
		return v.Float(), true
	}
	return nil, false
}

// tables reports whether values of t are written as TOML tables.
func tables(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Map || t.Kind() == reflect.Struct && t != timeType
}

// MarshalTOML writes a config value as TOML through [Tree]. The output is
// deterministic: struct fields in declaration order, map keys sorted.
func MarshalTOML(v any) ([]byte, error) {
	b, err := toml.Marshal(Tree(v))
	if err != nil {
		return nil, fmt.Errorf("state: encode toml: %w", err)
	}
	return b, nil
}

// Flatten lists the leaves of a tree as path → rendered value, e.g.
// "targets[1].weight" → "2". Arrays of scalars are one leaf.
func Flatten(t any) map[string]string {
	out := map[string]string{}
	flatten(t, "", out)
	return out
}

func flatten(t any, path string, out map[string]string) {
	switch x := t.(type) {
	case map[string]any:
		for k, v := range x {
			p := k
			if path != "" {
				p = path + "." + k
			}
			flatten(v, p, out)
		}
	case []any:
		scalars := true
		for _, v := range x {
			switch v.(type) {
			case map[string]any, []any:
				scalars = false
			}
		}
		if scalars {
			out[path] = Render(x)
			return
		}
		for i, v := range x {
			flatten(v, fmt.Sprintf("%s[%d]", path, i), out)
		}
	default:
		out[path] = Render(x)
	}
}

// Render writes one scalar or array of scalars in TOML syntax.
func Render(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case time.Time:
		return x.Format(time.RFC3339Nano)
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") {
			s += ".0"
		}
		return s
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = Render(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	default:
		return fmt.Sprint(x)
	}
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
