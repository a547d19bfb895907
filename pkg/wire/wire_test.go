package wire_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"rolter.dev/pkg/wire"
)

// What the Append functions write, a Reader reads back, and Done checks
// that nothing is left.
func TestRoundTrip(t *testing.T) {
	b := []byte("mag")
	b = binary.AppendUvarint(b, 300)
	b = binary.AppendVarint(b, -7)
	b = binary.LittleEndian.AppendUint64(b, 1<<60)
	b = wire.AppendFloat64(b, 2.5)
	b = wire.AppendBool(b, true)
	b = wire.AppendBytes(b, []byte("xyz"))
	b = binary.AppendUvarint(b, 2) // two items of 8 bytes
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = binary.LittleEndian.AppendUint64(b, 2)
	r := wire.NewReader(b)
	r.Magic("mag")
	if v := r.Uvarint("u"); v != 300 {
		t.Errorf("uvarint %d", v)
	}
	if v := r.Varint("v"); v != -7 {
		t.Errorf("varint %d", v)
	}
	if v := r.Uint64("w"); v != 1<<60 {
		t.Errorf("uint64 %d", v)
	}
	if v := r.Float64("f"); v != 2.5 {
		t.Errorf("float %v", v)
	}
	if !r.Bool("b") {
		t.Error("bool false")
	}
	if v := string(r.Bytes("s", 10)); v != "xyz" {
		t.Errorf("bytes %q", v)
	}
	if n := r.Items("items", 8, 5); n != 2 {
		t.Errorf("items %d", n)
	}
	r.Uint64("1")
	r.Uint64("2")
	if err := r.Done(); err != nil {
		t.Fatal(err)
	}
}

// Each way input can be wrong fails with ErrCorrupt, and the first error
// sticks: later reads return zeros.
func TestFailures(t *testing.T) {
	nan := wire.AppendFloat64(nil, math.NaN())
	inf := wire.AppendFloat64(nil, math.Inf(1))
	many := binary.AppendUvarint(nil, 1000)
	for name, in := range map[string]struct {
		b    []byte
		read func(r *wire.Reader)
	}{
		"magic":         {[]byte("abc"), func(r *wire.Reader) { r.Magic("zz") }},
		"bytes left":    {[]byte("abc"), func(r *wire.Reader) { r.Uvarint(""); r.Done() }},
		"empty varint":  {nil, func(r *wire.Reader) { r.Uvarint("") }},
		"NaN":           {nan, func(r *wire.Reader) { r.Float64("") }},
		"infinity":      {inf, func(r *wire.Reader) { r.Float64("") }},
		"bool 2":        {[]byte{2}, func(r *wire.Reader) { r.Bool("") }},
		"short uint64":  {[]byte{1, 2}, func(r *wire.Reader) { r.Uint64("") }},
		"count limit":   {many, func(r *wire.Reader) { r.Count("", 999) }},
		"items room":    {append(many, 0), func(r *wire.Reader) { r.Items("", 1, 5000) }},
		"bytes room":    {append(many, 0), func(r *wire.Reader) { r.Bytes("", 5000) }},
		"bytes too big": {append(binary.AppendUvarint(nil, 3), "abc"...), func(r *wire.Reader) { r.Bytes("", 2) }},
		// Non-minimal varints (Go's decoder takes them): a record must read
		// back as the bytes it was read from.
		"uvarint 0 in two bytes":   {[]byte{0x80, 0x00}, func(r *wire.Reader) { r.Uvarint("") }},
		"uvarint 1 in three bytes": {[]byte{0x81, 0x80, 0x00}, func(r *wire.Reader) { r.Uvarint("") }},
		"varint -1 in two bytes":   {[]byte{0x81, 0x00}, func(r *wire.Reader) { r.Varint("") }},
		"count 0 in two bytes":     {[]byte{0x80, 0x00}, func(r *wire.Reader) { r.Count("", 5) }},
	} {
		r := wire.NewReader(in.b)
		in.read(r)
		if !errors.Is(r.Err(), wire.ErrCorrupt) {
			t.Errorf("%s: err %v, want ErrCorrupt", name, r.Err())
		}
		if r.Uvarint("after") != 0 || r.Len() != 0 {
			t.Errorf("%s: a read after the error returned data", name)
		}
	}
}

// TestMinimalVarints: every value's own encoding reads back, at the
// edges of each length.
func TestMinimalVarints(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 16383, 16384, 1<<63 - 1, 1 << 63, math.MaxUint64} {
		r := wire.NewReader(binary.AppendUvarint(nil, v))
		if got := r.Uvarint(""); got != v || r.Done() != nil {
			t.Errorf("uvarint %d read as %d: %v", v, got, r.Err())
		}
	}
	for _, v := range []int64{0, -1, 1, -64, 63, -65, 64, math.MinInt64, math.MaxInt64} {
		r := wire.NewReader(binary.AppendVarint(nil, v))
		if got := r.Varint(""); got != v || r.Done() != nil {
			t.Errorf("varint %d read as %d: %v", v, got, r.Err())
		}
	}
}

// FuzzReader: any sequence of reads over any input never panics, never
// reads past the input, and fails only with ErrCorrupt.
func FuzzReader(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, []byte{0, 1, 2, 3, 4, 5, 6})
	f.Fuzz(func(t *testing.T, data, ops []byte) {
		r := wire.NewReader(data)
		for _, op := range ops {
			before := r.Len()
			switch op % 8 {
			case 0:
				r.Uvarint("")
			case 1:
				r.Varint("")
			case 2:
				r.Uint64("")
			case 3:
				r.Float64("")
			case 4:
				r.Bool("")
			case 5:
				if b := r.Bytes("", int(op)); len(b) > before {
					t.Fatalf("read %d bytes of %d", len(b), before)
				}
			case 6:
				if n := r.Items("", 1+int(op>>4), 1<<20); n > before {
					t.Fatalf("%d items in %d bytes", n, before)
				}
			case 7:
				r.Count("", int(op))
			}
			if r.Len() > before {
				t.Fatal("a read grew the input")
			}
		}
		if err := r.Done(); err != nil && !errors.Is(err, wire.ErrCorrupt) {
			t.Fatalf("error %v does not wrap ErrCorrupt", err)
		}
	})
}
