package routingstate_test

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"rolter.dev/dataplane/internal/routingstate"
	"rolter.dev/pkg/wire"
)

func sample() []routingstate.Route {
	return []routingstate.Route{
		{Route: "m", Settings: "predicted_ttft|{}|0s", Targets: []string{routingstate.TargetKey("a", "m"), routingstate.TargetKey("b", "m")}, State: []byte{1, 2, 3}},
		{Route: "canary", Variant: "new", Settings: "s", Targets: []string{routingstate.TargetKey("c", "x")}, State: []byte{}},
	}
}

// Saved and loaded, the routes and the time come back as they were; a
// missing file is a first start, not an error.
func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir", "routing.state")
	routes, at, err := routingstate.Load(path)
	if routes != nil || !at.IsZero() || err != nil {
		t.Fatalf("missing file: %v %v %v, want nothing and no error", routes, at, err)
	}
	before := time.Now()
	size, err := routingstate.Save(path, sample())
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi == nil || fi.Size() != int64(size) {
		t.Fatalf("Save reported %d bytes, the file has %v", size, fi)
	}
	routes, at, err = routingstate.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(routes, sample()) {
		t.Fatalf("loaded %+v, want %+v", routes, sample())
	}
	if at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
		t.Fatalf("saved at %v, want about %v", at, before)
	}
}

// A damaged file is refused with wire.ErrCorrupt: any flipped byte (the
// checksum), any truncation; a file whose checksum is right but whose
// contents are not is refused by the decoder.
func TestDecodeRefusesDamage(t *testing.T) {
	data := routingstate.Append(nil, sample(), time.Unix(5, 0))
	for i := range data {
		bad := append([]byte(nil), data...)
		bad[i] ^= 0x10
		if _, _, err := routingstate.Decode(bad); !errors.Is(err, wire.ErrCorrupt) {
			t.Fatalf("byte %d flipped: err %v", i, err)
		}
	}
	for n := range data {
		if _, _, err := routingstate.Decode(data[:n]); !errors.Is(err, wire.ErrCorrupt) {
			t.Fatalf("cut to %d bytes: err %v", n, err)
		}
	}
	body := data[:len(data)-4]
	body = append(body[:len(body):len(body)], 0) // one byte more, checksummed
	if _, _, err := routingstate.Decode(binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)))); !errors.Is(err, wire.ErrCorrupt) {
		t.Fatalf("a trailing byte under a right checksum: err %v", err)
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("not a state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := routingstate.Load(path); !errors.Is(err, wire.ErrCorrupt) {
		t.Fatalf("a foreign file: err %v", err)
	}
}

// FuzzDecode checksums its input, so that the decoder behind the checksum
// is what is fuzzed: anything is refused, or reads back routes that
// write the same bytes.
func FuzzDecode(f *testing.F) {
	data := routingstate.Append(nil, sample(), time.Unix(5, 0))
	f.Add(data[:len(data)-4])
	f.Add([]byte("rolter-routing-state\x01"))
	table := crc32.MakeTable(crc32.Castagnoli)
	f.Fuzz(func(t *testing.T, body []byte) {
		in := binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, table))
		routes, at, err := routingstate.Decode(in)
		if err != nil {
			if !errors.Is(err, wire.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again := routingstate.Append(nil, routes, at)
		if string(again) != string(in) {
			t.Fatalf("read and written again differs:\n%x\n%x", in, again)
		}
	})
}
