package kvdelta

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	kvv1 "rolter.dev/proto/rolter/kv/v1"
)

// Version is the schema version this package writes and reads: the version
// field of rolter.kv.v1.Message (see the package documentation).
const Version = 1

// Errors wrapped by [Decode].
var (
	// ErrMalformed reports bytes that are not a valid version-1 message.
	ErrMalformed = errors.New("kvdelta: malformed message")
	// ErrVersion reports a message of another schema version.
	ErrVersion = errors.New("kvdelta: unsupported version")
)

// Limits of the encoding.
const (
	// MaxProviderLen is the longest provider name, in bytes.
	MaxProviderLen = 255
	// maxMillis bounds decoded durations (about 35 years), so that they fit
	// a time.Duration.
	maxMillis = 1 << 40
	// maxParts bounds a snapshot's part count.
	maxParts = 1 << 24
	// maxCount bounds a status's block size and block count.
	maxCount = math.MaxInt32
)

// Type is a message's type.
type Type uint8

// The message types.
const (
	// TypeDelta carries ops and takes the next sequence number.
	TypeDelta Type = 1
	// TypeStatus is a heartbeat (or an LMCache update): the provider's
	// status and the sequence of its last delta.
	TypeStatus Type = 2
	// TypeSnapshot is one part of a provider's full state at Seq.
	TypeSnapshot Type = 3
	// TypeSnapshotRequest asks for a snapshot; Epoch is the epoch wanted
	// (0: any watcher answers).
	TypeSnapshotRequest Type = 4
)

// String names the type.
func (t Type) String() string {
	switch t {
	case TypeDelta:
		return "delta"
	case TypeStatus:
		return "status"
	case TypeSnapshot:
		return "snapshot"
	case TypeSnapshotRequest:
		return "snapshot_request"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// OpKind is what an [Op] does.
type OpKind uint8

// The op kinds.
const (
	// OpStored makes IDs resident. IDs form a chain: each one's parent is
	// the one before it, and the first one's is Parent when HasParent
	// (else it starts a chain at the model's seed).
	OpStored OpKind = 1
	// OpRemoved makes IDs not resident.
	OpRemoved OpKind = 2
	// OpCleared empties the provider's state.
	OpCleared OpKind = 3
)

// String names the kind.
func (k OpKind) String() string {
	switch k {
	case OpStored:
		return "stored"
	case OpRemoved:
		return "removed"
	case OpCleared:
		return "cleared"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Reason says why a provider's state was cleared.
type Reason uint8

// The clear reasons.
const (
	// ReasonEngine is the engine's AllBlocksCleared (e.g. a prefix-cache
	// reset).
	ReasonEngine Reason = 1
	// ReasonGap is a sequence gap the watcher could not repair: the state
	// is unknown until the engine clears (the provider is not synced).
	ReasonGap Reason = 2
	// ReasonRestart is a publisher whose sequence went back (a restarted
	// engine).
	ReasonRestart Reason = 3
	// ReasonReconnect is a new connection to the publisher.
	ReasonReconnect Reason = 4
	// ReasonConfig is a change of the provider's configuration (or its
	// removal).
	ReasonConfig Reason = 5
)

// String names the reason.
func (r Reason) String() string {
	switch r {
	case ReasonEngine:
		return "engine"
	case ReasonGap:
		return "gap"
	case ReasonRestart:
		return "restart"
	case ReasonReconnect:
		return "reconnect"
	case ReasonConfig:
		return "config"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Op is one change of a provider's resident set.
type Op struct {
	Kind OpKind
	// Parent is, for OpStored with HasParent, the identity preceding
	// IDs[0] in its chain.
	Parent    uint64
	HasParent bool
	// IDs are the identities stored or removed (not empty).
	IDs []uint64
	// Reason is why an OpCleared cleared.
	Reason Reason
}

// Status is a provider's telemetry status as the watcher sees it. The KV
// fields other than KV are encoded only when KV is set, the LMCache ones
// only when LM is.
type Status struct {
	// KV is set when the provider has a KV-event stream.
	KV bool
	// Synced is set when the watcher's state mirrors the engine's: the
	// stream is connected and no gap is left unrepaired. A provider that
	// is not synced scores neutral.
	Synced bool
	// KVAge is the time since the watcher last applied an engine batch;
	// negative when it has applied none since the stream (re)started.
	KVAge time.Duration
	// KVStale is the provider's stale_secs: telemetry older than this is
	// stale.
	KVStale time.Duration
	// BlockSize is the engine's tokens per block (0 until known).
	BlockSize int
	// Blocks is the number of resident identities.
	Blocks int

	// LM is set when the provider's LMCache occupancy is polled.
	LM bool
	// LMAvailable is LMCache's cache_available.
	LMAvailable bool
	// Occupancy is LMCache's occupancy, in [0, 1].
	Occupancy float64
	// LMAge is the time since the last successful poll; negative when none
	// succeeded yet.
	LMAge time.Duration
	// LMStale is the provider's lmcache stale_secs.
	LMStale time.Duration

	// Heartbeat is the watcher's heartbeat period: a status of the
	// provider comes at least this often. 0 when the watcher does not
	// say (an older one).
	Heartbeat time.Duration
}

// Message is one NATS message (see the package documentation for which
// fields each type uses).
type Message struct {
	Type     Type
	Epoch    uint64
	Seq      uint64
	Provider string
	Status   Status
	// Ops are a delta's changes, applied in order.
	Ops []Op
	// Part and Parts number a snapshot's parts (Part < Parts).
	Part, Parts int
	// IDs are a snapshot part's resident identities.
	IDs []uint64
}

// Subject returns the subject of provider's deltas and statuses.
func Subject(provider string) string { return "rolter.kv.v1.delta." + Token(provider) }

// SnapshotSubject returns the subject of provider's snapshot requests.
func SnapshotSubject(provider string) string { return "rolter.kv.v1.snap." + Token(provider) }

// Token returns provider as one NATS subject token: itself when it consists
// of ASCII letters, digits, '-' and '_', else "~" followed by its bytes in
// hex (so distinct names get distinct tokens).
func Token(provider string) string {
	plain := provider != ""
	for i := 0; i < len(provider) && plain; i++ {
		c := provider[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	if plain {
		return provider
	}
	return "~" + hex.EncodeToString([]byte(provider))
}

// Encode returns m's encoding; see [Message.Append].
func Encode(m *Message) ([]byte, error) { return m.Append(nil) }

// Append appends m's encoding (a rolter.kv.v1.Message) to dst. It fails
// when m is not encodable: an unknown type or op, a provider name that is
// empty, too long or not UTF-8, an empty op list or ID list, an occupancy
// outside [0, 1], bad snapshot part numbers.
func (m *Message) Append(dst []byte) ([]byte, error) {
	if err := m.check(); err != nil {
		return dst, err
	}
	pb := &kvv1.Message{
		Version: Version, Type: kvv1.Type(m.Type), Epoch: m.Epoch, Seq: m.Seq, Provider: m.Provider,
		Status: toProtoStatus(&m.Status),
	}
	switch m.Type {
	case TypeDelta:
		pb.Ops = make([]*kvv1.Op, len(m.Ops))
		for i := range m.Ops {
			pb.Ops[i] = toProtoOp(&m.Ops[i])
		}
	case TypeSnapshot:
		pb.Snapshot = &kvv1.SnapshotPart{Part: uint32(m.Part), Parts: uint32(m.Parts), Ids: m.IDs}
	}
	out, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(dst, pb)
	if err != nil {
		return dst, fmt.Errorf("kvdelta: encode: %w", err)
	}
	return out, nil
}

func (m *Message) check() error {
	if m.Type < TypeDelta || m.Type > TypeSnapshotRequest {
		return fmt.Errorf("kvdelta: encode: unknown type %d", m.Type)
	}
	if m.Provider == "" || len(m.Provider) > MaxProviderLen || !utf8.ValidString(m.Provider) {
		return fmt.Errorf("kvdelta: encode: provider name of %d bytes, want 1..%d bytes of UTF-8", len(m.Provider), MaxProviderLen)
	}
	if s := &m.Status; s.LM && !(s.Occupancy >= 0 && s.Occupancy <= 1) {
		return fmt.Errorf("kvdelta: encode: occupancy %v outside [0, 1]", s.Occupancy)
	}
	switch m.Type {
	case TypeDelta:
		if len(m.Ops) == 0 {
			return errors.New("kvdelta: encode: delta without ops")
		}
		for i, op := range m.Ops {
			switch op.Kind {
			case OpStored, OpRemoved:
				if len(op.IDs) == 0 {
					return fmt.Errorf("kvdelta: encode: op %d (%s) without ids", i, op.Kind)
				}
			case OpCleared:
				if op.Reason < ReasonEngine || op.Reason > ReasonConfig {
					return fmt.Errorf("kvdelta: encode: op %d: unknown clear reason %d", i, op.Reason)
				}
			default:
				return fmt.Errorf("kvdelta: encode: op %d: unknown kind %d", i, op.Kind)
			}
		}
	case TypeSnapshot:
		if m.Parts < 1 || m.Part < 0 || m.Part >= m.Parts || m.Parts > maxParts {
			return fmt.Errorf("kvdelta: encode: snapshot part %d of %d", m.Part, m.Parts)
		}
	}
	return nil
}

func toProtoStatus(s *Status) *kvv1.Status {
	if !s.KV && !s.LM && millis(s.Heartbeat) == 0 {
		return nil
	}
	out := &kvv1.Status{HeartbeatMs: millis(s.Heartbeat)}
	if s.KV {
		out.Kv = &kvv1.KVStatus{
			Synced: s.Synced, AgeMs: ageMillis(s.KVAge), StaleMs: millis(s.KVStale),
			BlockSize: uint32(min(max(s.BlockSize, 0), maxCount)), Blocks: uint64(min(max(s.Blocks, 0), maxCount)),
		}
	}
	if s.LM {
		out.Lmcache = &kvv1.LMCacheStatus{
			Available: s.LMAvailable, Occupancy: s.Occupancy, AgeMs: ageMillis(s.LMAge), StaleMs: millis(s.LMStale),
		}
	}
	return out
}

// ageMillis encodes an age: absent for none (negative).
func ageMillis(d time.Duration) *uint64 {
	if d < 0 {
		return nil
	}
	v := millis(d)
	return &v
}

func millis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return min(uint64(d/time.Millisecond), maxMillis)
}

func toProtoOp(op *Op) *kvv1.Op {
	switch op.Kind {
	case OpStored:
		st := &kvv1.Stored{Ids: op.IDs}
		if op.HasParent {
			st.Parent = &op.Parent
		}
		return &kvv1.Op{Op: &kvv1.Op_Stored{Stored: st}}
	case OpRemoved:
		return &kvv1.Op{Op: &kvv1.Op_Removed{Removed: &kvv1.Removed{Ids: op.IDs}}}
	default:
		return &kvv1.Op{Op: &kvv1.Op_Cleared{Cleared: &kvv1.Cleared{Reason: kvv1.ClearReason(op.Reason)}}}
	}
}

// PartIDs returns how many identities fit one snapshot message of at most
// maxPayload bytes for provider (at least 1).
func PartIDs(maxPayload int, provider string) int {
	// Everything but the IDs, at its largest: version, type, epoch and seq
	// ≤ 24 bytes; the provider ≤ 3 + len; the status ≤ 106 (two
	// sub-messages of varints and a double, and the heartbeat); the
	// snapshot part's header ≤ 24. Each ID is 8 bytes.
	overhead := 24 + 3 + len(provider) + 106 + 24 + 14 // 14: slack
	return max((maxPayload-overhead)/8, 1)
}

// Decode decodes one message; see [Message] and the package documentation
// for what is accepted. The Message does not alias b.
func Decode(b []byte) (*Message, error) {
	m := &Message{}
	if err := DecodeInto(m, b); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeInto decodes b into m, overwriting every field. On error m holds
// partial results.
func DecodeInto(m *Message, b []byte) error {
	*m = Message{}
	var pb kvv1.Message
	// Unknown fields (from a newer minor revision of the schema) are
	// skipped; what this version needs is checked below.
	if err := proto.Unmarshal(b, &pb); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch pb.Version {
	case Version:
	case 0: // every encoder writes it: these bytes are no message of ours
		return malformed("no version")
	default:
		return fmt.Errorf("%w: %d (want %d)", ErrVersion, pb.Version, Version)
	}
	m.Type, m.Epoch, m.Seq, m.Provider = Type(pb.Type), pb.Epoch, pb.Seq, pb.Provider
	if m.Type < TypeDelta || m.Type > TypeSnapshotRequest {
		return malformed("unknown type %d", int32(pb.Type))
	}
	if n := len(pb.Provider); n == 0 || n > MaxProviderLen {
		return malformed("provider name of %d bytes", n)
	}
	if err := fromProtoStatus(&m.Status, pb.Status); err != nil {
		return err
	}
	if m.Type != TypeDelta && len(pb.Ops) > 0 {
		return malformed("%s with ops", m.Type)
	}
	if (m.Type == TypeSnapshot) != (pb.Snapshot != nil) {
		return malformed("%s with snapshot part %t", m.Type, pb.Snapshot != nil)
	}
	switch m.Type {
	case TypeDelta:
		if len(pb.Ops) == 0 {
			return malformed("delta without ops")
		}
		m.Ops = make([]Op, len(pb.Ops))
		for i, op := range pb.Ops {
			if err := fromProtoOp(&m.Ops[i], op); err != nil {
				return fmt.Errorf("%w (op %d)", err, i)
			}
		}
	case TypeSnapshot:
		sp := pb.Snapshot
		if sp.Parts == 0 || sp.Parts > maxParts || sp.Part >= sp.Parts {
			return malformed("snapshot part %d of %d", sp.Part, sp.Parts)
		}
		m.Part, m.Parts = int(sp.Part), int(sp.Parts)
		if len(sp.Ids) > 0 {
			m.IDs = sp.Ids
		}
	}
	return nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

func fromProtoStatus(s *Status, pb *kvv1.Status) error {
	if pb == nil {
		return nil
	}
	var err error
	if s.Heartbeat, err = duration(pb.HeartbeatMs); err != nil {
		return err
	}
	if kv := pb.Kv; kv != nil {
		s.KV, s.Synced = true, kv.Synced
		if kv.BlockSize > maxCount || kv.Blocks > maxCount {
			return malformed("block size %d, %d blocks", kv.BlockSize, kv.Blocks)
		}
		s.BlockSize, s.Blocks = int(kv.BlockSize), int(kv.Blocks)
		if s.KVAge, err = age(kv.AgeMs); err != nil {
			return err
		}
		if s.KVStale, err = duration(kv.StaleMs); err != nil {
			return err
		}
	}
	if lm := pb.Lmcache; lm != nil {
		s.LM, s.LMAvailable, s.Occupancy = true, lm.Available, lm.Occupancy
		// NaN and ±Inf fail this too.
		if !(lm.Occupancy >= 0 && lm.Occupancy <= 1) {
			return malformed("occupancy %v", lm.Occupancy)
		}
		if s.LMAge, err = age(lm.AgeMs); err != nil {
			return err
		}
		if s.LMStale, err = duration(lm.StaleMs); err != nil {
			return err
		}
	}
	return nil
}

func age(ms *uint64) (time.Duration, error) {
	if ms == nil {
		return -1, nil
	}
	return duration(*ms)
}

func duration(ms uint64) (time.Duration, error) {
	if ms > maxMillis {
		return 0, malformed("duration of %d ms", ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func fromProtoOp(op *Op, pb *kvv1.Op) error {
	switch o := pb.GetOp().(type) {
	case *kvv1.Op_Stored:
		op.Kind = OpStored
		if p := o.Stored.GetParent(); o.Stored.Parent != nil {
			op.Parent, op.HasParent = p, true
		}
		op.IDs = o.Stored.GetIds()
	case *kvv1.Op_Removed:
		op.Kind = OpRemoved
		op.IDs = o.Removed.GetIds()
	case *kvv1.Op_Cleared:
		op.Kind = OpCleared
		op.Reason = Reason(o.Cleared.GetReason())
		if r := o.Cleared.GetReason(); r < kvv1.ClearReason_CLEAR_REASON_ENGINE || r > kvv1.ClearReason_CLEAR_REASON_CONFIG {
			return malformed("unknown clear reason %d", int32(r))
		}
		return nil
	default:
		return malformed("op without a kind")
	}
	if len(op.IDs) == 0 {
		return malformed("%s op without ids", op.Kind)
	}
	return nil
}
