package kvevents

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// vector is one payload of vectors.json: the bytes msgspec wrote and the
// value msgspec's generic decoder read back.
type vector struct {
	Hex     string          `json:"hex"`
	Len     int             `json:"len"`
	Generic json.RawMessage `json:"generic"`
}

// vectorFiles are the vector files: the copy kept with the package, and the
// shared one when the checkout has it beside the repository (so that vectors
// added there are covered without a copy).
func vectorFiles(t testing.TB) []string {
	files := []string{filepath.Join("testdata", "vectors.json")}
	for _, p := range []string{
		filepath.Join("..", "..", "..", "shared", "testdata", "kvevents", "vectors.json"),
		filepath.Join("..", "..", "..", "shared", "testdata", "kvevents", "vectors_extra.json"),
	} {
		if _, err := os.Stat(p); err == nil {
			files = append(files, p)
		}
	}
	return files
}

// loadVectors returns the vectors by "generation/event" name.
func loadVectors(t testing.TB) map[string]vector {
	t.Helper()
	out := map[string]vector{}
	for _, f := range vectorFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("read %s: %v", f, err)
		}
		var gens map[string]json.RawMessage
		if err := json.Unmarshal(raw, &gens); err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		for gen, body := range gens {
			var events map[string]vector
			if err := json.Unmarshal(body, &events); err != nil {
				continue // not a generation of payloads (e.g. frame bytes)
			}
			for ev, v := range events {
				if v.Hex == "" {
					continue
				}
				out[gen+"/"+ev] = v
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no vectors")
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// normJSON turns a JSON value (decoded with UseNumber) into the comparable
// generic form: numbers as "i:<int>" or "f:<float>".
func normJSON(v any) any {
	switch v := v.(type) {
	case json.Number:
		s := string(v)
		if !strings.ContainsAny(s, ".eE") {
			return "i:" + s
		}
		f, _ := strconv.ParseFloat(s, 64)
		return "f:" + strconv.FormatFloat(f, 'g', -1, 64)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = normJSON(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = normJSON(e)
		}
		return out
	}
	return v
}

func parseGeneric(t testing.TB, raw json.RawMessage) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("generic: %v", err)
	}
	return normJSON(v)
}

// The generic form of typed values, as msgspec's generic decoder would give
// them for layout l.
func gInt(i int64) any     { return "i:" + strconv.FormatInt(i, 10) }
func gUint(u uint64) any   { return "i:" + strconv.FormatUint(u, 10) }
func gFloat(f float64) any { return "f:" + strconv.FormatFloat(f, 'g', -1, 64) }
func gOptInt(v Opt[int64]) any {
	if !v.Valid {
		return nil
	}
	return gInt(v.V)
}
func gOptStr(v Opt[string]) any {
	if !v.Valid {
		return nil
	}
	return v.V
}
func gHash(h Hash) any {
	switch h.Form() {
	case HashBytes:
		return base64.StdEncoding.EncodeToString(h.Bytes())
	case HashInt:
		return gInt(h.Int64())
	}
	return gUint(h.Uint64())
}

func gStoredField(t testing.TB, ev *BlockStored, f field) any {
	switch f {
	case fBlockHashes:
		out := []any{}
		for _, h := range ev.BlockHashes {
			out = append(out, gHash(h))
		}
		return out
	case fParentBlockHash:
		if !ev.ParentBlockHash.Valid {
			return nil
		}
		return gHash(ev.ParentBlockHash.V)
	case fTokenIDs:
		out := []any{}
		for _, tok := range ev.TokenIDs {
			out = append(out, gUint(uint64(tok)))
		}
		return out
	case fBlockSize:
		return gInt(int64(ev.BlockSize))
	case fLoRAID:
		return gOptInt(ev.LoRAID)
	case fMedium:
		return gOptStr(ev.Medium)
	case fLoRAName:
		return gOptStr(ev.LoRAName)
	case fExtraKeys:
		if ev.ExtraKeys == nil {
			return nil
		}
		out := []any{}
		for _, k := range ev.ExtraKeys {
			v, err := k.Value()
			if err != nil {
				t.Fatalf("extra key: %v", err)
			}
			out = append(out, normGo(v))
		}
		return out
	case fGroupIdx:
		return gOptInt(ev.GroupIdx)
	case fSpecKind:
		return gOptStr(ev.KVCacheSpecKind)
	case fSpecWindow:
		return gOptInt(ev.KVCacheSpecSlidingWindow)
	case fLocality:
		return gOptStr(ev.Locality)
	case fOwnership:
		return gOptStr(ev.Ownership)
	case fSessionID:
		return gOptStr(ev.SessionID)
	}
	t.Fatalf("field %d", f)
	return nil
}

// normGo turns a value from msgpack.Unmarshal into the generic form.
func normGo(v any) any {
	rv := reflect.ValueOf(v)
	switch {
	case v == nil:
		return nil
	case rv.CanInt():
		return gInt(rv.Int())
	case rv.CanUint():
		return gUint(rv.Uint())
	case rv.CanFloat():
		return gFloat(rv.Float())
	}
	switch v := v.(type) {
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = normGo(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = normGo(e)
		}
		return out
	}
	return v
}

// toGeneric renders a typed batch in the generic form of layout l.
func toGeneric(t testing.TB, b *Batch, l Layout) any {
	t.Helper()
	events := []any{}
	for _, ev := range b.Events {
		var stored *BlockStored
		var fields []field
		var tag string
		switch ev := ev.(type) {
		case *BlockStored:
			stored, fields, tag = ev, storedFields[:], tagBlockStored
			if l.Form == FormArray {
				fields = fields[:l.StoredLen-1]
			}
		case *BlockRemoved:
			stored = &BlockStored{BlockHashes: ev.BlockHashes, Medium: ev.Medium, GroupIdx: ev.GroupIdx, Locality: ev.Locality, Ownership: ev.Ownership}
			fields, tag = removedFields[:], tagBlockRemoved
			if l.Form == FormArray {
				fields = fields[:l.RemovedLen-1]
			}
		case *AllBlocksCleared:
			tag = tagAllBlocksCleared
		}
		if l.Form == FormMap {
			m := map[string]any{"type": tag}
			for _, f := range fields {
				if storedSet(stored, f) {
					m[fieldNames[f]] = gStoredField(t, stored, f)
				}
			}
			events = append(events, m)
			continue
		}
		a := []any{tag}
		for _, f := range fields {
			a = append(a, gStoredField(t, stored, f))
		}
		events = append(events, a)
	}
	if l.MapBatch {
		m := map[string]any{"ts": gFloat(b.TS), "events": events}
		if b.DataParallelRank.Valid {
			m["data_parallel_rank"] = gInt(b.DataParallelRank.V)
		}
		return m
	}
	out := []any{gFloat(b.TS), events}
	if !l.NoRank {
		out = append(out, gOptInt(b.DataParallelRank))
	}
	return out
}

// sameBatch compares the decoded content of two batches (not the counters
// or the layout), treating a nil and an empty list of hashes or tokens as
// equal (both encode as []) and comparing ts by bits (NaN).
func sameBatch(a, b *Batch) bool {
	if math.Float64bits(a.TS) != math.Float64bits(b.TS) || a.DataParallelRank != b.DataParallelRank || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		switch x := x.(type) {
		case *BlockStored:
			y, ok := y.(*BlockStored)
			if !ok {
				return false
			}
			xc, yc := *x, *y
			if !slices.Equal(xc.BlockHashes, yc.BlockHashes) || !slices.Equal(xc.TokenIDs, yc.TokenIDs) {
				return false
			}
			xc.BlockHashes, yc.BlockHashes, xc.TokenIDs, yc.TokenIDs = nil, nil, nil, nil
			if !reflect.DeepEqual(xc, yc) {
				return false
			}
		case *BlockRemoved:
			y, ok := y.(*BlockRemoved)
			if !ok {
				return false
			}
			xc, yc := *x, *y
			if !slices.Equal(xc.BlockHashes, yc.BlockHashes) {
				return false
			}
			xc.BlockHashes, yc.BlockHashes = nil, nil
			if !reflect.DeepEqual(xc, yc) {
				return false
			}
		case *AllBlocksCleared:
			if _, ok := y.(*AllBlocksCleared); !ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}
