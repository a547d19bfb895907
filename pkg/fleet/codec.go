package fleet

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"rolter.dev/pkg/routing"
	fleetv1 "rolter.dev/proto/rolter/fleet/v1"
)

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("fleet: malformed message")

// Limits a decoded message must respect.
const (
	maxIDBytes    = 64
	maxRouteBytes = 1024
	maxTargets    = 256 // rolter.dev/pkg/routing.MaxTargets
)

// Subjects returns the NATS subjects of a group: observations, loads and
// snapshot requests.
func Subjects(group string) (obs, load, snap string) {
	p := "rolter.fleet.v1." + group + "."
	return p + "obs", p + "load", p + "snap"
}

func encode(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		// Marshal fails only on invalid UTF-8 in a string field, and every
		// string here is a route name or id that came in as valid UTF-8.
		panic(fmt.Sprintf("fleet: encode %T: %v", m, err))
	}
	return b
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

func checkID(id string) error {
	if id == "" || len(id) > maxIDBytes {
		return malformed("proxy id of %d bytes (want 1..%d)", len(id), maxIDBytes)
	}
	return nil
}

// validRoute reports whether a route name from the wire is one a route can
// have: not empty, at most maxRouteBytes.
func validRoute(name string) bool { return name != "" && len(name) <= maxRouteBytes }

func checkRoutes(rs []*fleetv1.RouteChunks) error {
	for _, r := range rs {
		if !validRoute(r.Route) {
			return malformed("route name of %d bytes", len(r.Route))
		}
		for _, t := range r.Targets {
			if t.Target >= maxTargets {
				return malformed("route %q: target %d out of range", r.Route, t.Target)
			}
		}
	}
	return nil
}

// DecodeObservations decodes and checks an Observations message.
func DecodeObservations(b []byte) (*fleetv1.Observations, error) {
	m := &fleetv1.Observations{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, malformed("observations: %v", err)
	}
	if err := checkID(m.Proxy); err != nil {
		return nil, err
	}
	if m.Seq == 0 {
		return nil, malformed("observations: seq 0")
	}
	if err := checkRoutes(m.Routes); err != nil {
		return nil, err
	}
	for _, q := range m.Queues {
		if !validRoute(q.Route) {
			return nil, malformed("queues: route name of %d bytes", len(q.Route))
		}
		for _, t := range q.Targets {
			if t.Target >= maxTargets {
				return nil, malformed("queues: route %q: target %d out of range", q.Route, t.Target)
			}
		}
		if len(q.ArrivalAgesUs) > routing.MaxReportedArrivals {
			return nil, malformed("queues: route %q: %d arrivals (at most %d)", q.Route, len(q.ArrivalAgesUs), routing.MaxReportedArrivals)
		}
	}
	if len(m.Queues) > 0 && m.QueueTtlMs == 0 {
		return nil, malformed("observations: queues with ttl 0")
	}
	return m, nil
}

// DecodeLoads decodes and checks a Loads message.
func DecodeLoads(b []byte) (*fleetv1.Loads, error) {
	m := &fleetv1.Loads{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, malformed("loads: %v", err)
	}
	if err := checkID(m.Proxy); err != nil {
		return nil, err
	}
	if m.TtlMs == 0 {
		return nil, malformed("loads: ttl 0")
	}
	for _, r := range m.Routes {
		if !validRoute(r.Route) || len(r.InFlight) > maxTargets {
			return nil, malformed("loads: route %q with %d targets", r.Route, len(r.InFlight))
		}
	}
	if len(m.Echoes) > maxEchoes {
		return nil, malformed("loads: %d echoes (at most %d)", len(m.Echoes), maxEchoes)
	}
	for _, e := range m.Echoes {
		if err := checkID(e.Proxy); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// DecodeSnapshotRequest decodes and checks a SnapshotRequest.
func DecodeSnapshotRequest(b []byte) (*fleetv1.SnapshotRequest, error) {
	m := &fleetv1.SnapshotRequest{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, malformed("snapshot request: %v", err)
	}
	if err := checkID(m.Proxy); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeSnapshot decodes and checks a Snapshot.
func DecodeSnapshot(b []byte) (*fleetv1.Snapshot, error) {
	m := &fleetv1.Snapshot{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, malformed("snapshot: %v", err)
	}
	if err := checkID(m.Proxy); err != nil {
		return nil, err
	}
	if err := checkRoutes(m.Routes); err != nil {
		return nil, err
	}
	return m, nil
}
