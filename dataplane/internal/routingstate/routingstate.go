// Package routingstate is the proxy's --routing-state file: what each
// route's balancer learned (rolter.dev/pkg/routing.StateKeeper: for
// predicted_ttft its latency law and approximate index), written now and
// then and at shutdown, and read back at the next start, so that a
// restarted proxy routes as it did instead of from nothing.
//
// The file is binary, written atomically (rolter.dev/pkg/atomicfile):
//
//	"rolter-routing-state" 1       magic and version
//	saved at                       Unix nanoseconds (varint)
//	routes, then per route:        (byte strings are length-prefixed)
//	  route, variant, settings     the route's model, its variant ("" for none), its balancer's settings
//	  targets × key                provider and upstream model of each target, in the balancer's order
//	  state                        the balancer's own binary form
//	crc32                          Castagnoli, of everything before it (4 bytes, little-endian)
package routingstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"time"

	"rolter.dev/pkg/atomicfile"
	"rolter.dev/pkg/wire"
)

// Route is one balancer's saved state.
type Route struct {
	// Route is the route's model and Variant its variant's name ("" for a
	// route without variants).
	Route, Variant string
	// Settings identify the balancer's strategy and parameters: a state is
	// read back only by a balancer built with the same.
	Settings string
	// Targets name the balancer's targets in its order (provider and
	// upstream model, see TargetKey), so that a config listing them in
	// another order, or with one more or less, maps each to its own.
	Targets []string
	// State is the balancer's binary form (routing.StateKeeper).
	State []byte
}

// TargetKey names a target by its provider and upstream model.
func TargetKey(provider, model string) string { return provider + "\x1f" + model }

const magic = "rolter-routing-state\x01"

var table = crc32.MakeTable(crc32.Castagnoli)

// Limits on what a file may hold; a route has at most 256 targets
// (routing.MaxTargets).
const (
	maxRoutes  = 1 << 16
	maxTargets = 256
	maxString  = 1 << 16
)

// Append appends the file's contents for routes saved at savedAt to dst.
func Append(dst []byte, routes []Route, savedAt time.Time) []byte {
	start := len(dst)
	dst = append(dst, magic...)
	dst = binary.AppendVarint(dst, savedAt.UnixNano())
	dst = binary.AppendUvarint(dst, uint64(len(routes)))
	for _, r := range routes {
		dst = wire.AppendBytes(dst, []byte(r.Route))
		dst = wire.AppendBytes(dst, []byte(r.Variant))
		dst = wire.AppendBytes(dst, []byte(r.Settings))
		dst = binary.AppendUvarint(dst, uint64(len(r.Targets)))
		for _, t := range r.Targets {
			dst = wire.AppendBytes(dst, []byte(t))
		}
		dst = wire.AppendBytes(dst, r.State)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], table))
}

// Decode reads a file's contents. An error wraps wire.ErrCorrupt; the
// routes' states alias data.
func Decode(data []byte) ([]Route, time.Time, error) {
	if len(data) < 4 || crc32.Checksum(data[:len(data)-4], table) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, time.Time{}, fmt.Errorf("routing state: %w: checksum mismatch (a damaged or foreign file)", wire.ErrCorrupt)
	}
	r := wire.NewReader(data[:len(data)-4])
	r.Magic(magic)
	savedAt := time.Unix(0, r.Varint("saved at"))
	n := r.Items("routes", 4, maxRoutes)
	routes := make([]Route, 0, n)
	for range n {
		rt := Route{
			Route:    string(r.Bytes("route", maxString)),
			Variant:  string(r.Bytes("variant", maxString)),
			Settings: string(r.Bytes("settings", maxString)),
		}
		for range r.Items("targets", 1, maxTargets) {
			rt.Targets = append(rt.Targets, string(r.Bytes("target", maxString)))
		}
		rt.State = r.Bytes("state", r.Len())
		if r.Err() != nil {
			break
		}
		routes = append(routes, rt)
	}
	if err := r.Done(); err != nil {
		return nil, time.Time{}, fmt.Errorf("routing state: %w", err)
	}
	return routes, savedAt, nil
}

// Save writes routes to path atomically, saved now, and returns the
// file's size.
func Save(path string, routes []Route) (int, error) {
	data := Append(nil, routes, time.Now())
	return len(data), atomicfile.Write(path, data)
}

// Load reads the file at path. A missing file is no routes and no error:
// a first start.
func Load(path string) ([]Route, time.Time, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("routing state: %w", err)
	}
	routes, at, err := Decode(data)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	return routes, at, nil
}
