package kvdelta

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"
)

// Version is the encoding version this package writes and reads.
const Version byte = 1

// Errors wrapped by [Decode].
var (
	// ErrMalformed reports bytes that are not a version-1 message.
	ErrMalformed = errors.New("kvdelta: malformed message")
	// ErrVersion reports a message of another encoding version.
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

// Status is a provider's telemetry status as the watcher sees it.
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
}

const (
	flagKV          = 1
	flagSynced      = 2
	flagLM          = 4
	flagLMAvailable = 8
	flagsKnown      = flagKV | flagSynced | flagLM | flagLMAvailable
)

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

// Append appends m's encoding to dst. It fails when m is not encodable: an
// unknown type or op, a provider name that is empty or too long, an empty
// op list or ID list, an occupancy outside [0, 1], bad snapshot part
// numbers.
func (m *Message) Append(dst []byte) ([]byte, error) {
	if err := m.check(); err != nil {
		return dst, err
	}
	dst = append(dst, Version, byte(m.Type))
	dst = binary.LittleEndian.AppendUint64(dst, m.Epoch)
	dst = binary.AppendUvarint(dst, m.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(m.Provider)))
	dst = append(dst, m.Provider...)
	dst = appendStatus(dst, &m.Status)
	switch m.Type {
	case TypeDelta:
		dst = binary.AppendUvarint(dst, uint64(len(m.Ops)))
		for i := range m.Ops {
			dst = appendOp(dst, &m.Ops[i])
		}
	case TypeSnapshot:
		dst = binary.AppendUvarint(dst, uint64(m.Part))
		dst = binary.AppendUvarint(dst, uint64(m.Parts))
		dst = appendIDs(dst, m.IDs)
	}
	return dst, nil
}

func (m *Message) check() error {
	if m.Type < TypeDelta || m.Type > TypeSnapshotRequest {
		return fmt.Errorf("kvdelta: encode: unknown type %d", m.Type)
	}
	if m.Provider == "" || len(m.Provider) > MaxProviderLen {
		return fmt.Errorf("kvdelta: encode: provider name of %d bytes, want 1..%d", len(m.Provider), MaxProviderLen)
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

func appendStatus(dst []byte, s *Status) []byte {
	var f byte
	if s.KV {
		f |= flagKV
	}
	if s.Synced {
		f |= flagSynced
	}
	if s.LM {
		f |= flagLM
	}
	if s.LMAvailable {
		f |= flagLMAvailable
	}
	dst = append(dst, f)
	if s.KV {
		dst = binary.AppendUvarint(dst, ageMillis(s.KVAge))
		dst = binary.AppendUvarint(dst, millis(s.KVStale))
		dst = binary.AppendUvarint(dst, uint64(max(s.BlockSize, 0)))
		dst = binary.AppendUvarint(dst, uint64(max(s.Blocks, 0)))
	}
	if s.LM {
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(s.Occupancy))
		dst = binary.AppendUvarint(dst, ageMillis(s.LMAge))
		dst = binary.AppendUvarint(dst, millis(s.LMStale))
	}
	return dst
}

// ageMillis encodes an age: 0 for none (negative), else ms+1.
func ageMillis(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return min(millis(d), maxMillis-1) + 1
}

func millis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return min(uint64(d/time.Millisecond), maxMillis)
}

func appendOp(dst []byte, op *Op) []byte {
	dst = append(dst, byte(op.Kind))
	switch op.Kind {
	case OpStored:
		if op.HasParent {
			dst = append(dst, 1)
			dst = binary.LittleEndian.AppendUint64(dst, op.Parent)
		} else {
			dst = append(dst, 0)
		}
		dst = appendIDs(dst, op.IDs)
	case OpRemoved:
		dst = appendIDs(dst, op.IDs)
	case OpCleared:
		dst = append(dst, byte(op.Reason))
	}
	return dst
}

func appendIDs(dst []byte, ids []uint64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ids)))
	dst = growBy(dst, 8*len(ids))
	for _, id := range ids {
		dst = binary.LittleEndian.AppendUint64(dst, id)
	}
	return dst
}

func growBy(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), len(b)+n+len(b)/4)
	copy(nb, b)
	return nb
}

// PartIDs returns how many identities fit one snapshot message of at most
// maxPayload bytes for provider (at least 1).
func PartIDs(maxPayload int, provider string) int {
	// Header: 2 + 8 + 10 (seq) + 1 + len(provider); status ≤ 1 + 4×10 +
	// 8 + 2×10; part numbers and count ≤ 3×10.
	overhead := 2 + 8 + 10 + 1 + len(provider) + 1 + 40 + 8 + 20 + 30
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
	r := reader{b: b}
	if len(b) < 2 {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != Version {
		return fmt.Errorf("%w: %d (want %d)", ErrVersion, b[0], Version)
	}
	m.Type = Type(b[1])
	r.off = 2
	if m.Type < TypeDelta || m.Type > TypeSnapshotRequest {
		return fmt.Errorf("%w: unknown type %d", ErrMalformed, b[1])
	}
	m.Epoch = r.u64()
	m.Seq = r.uvarint()
	n := r.uvarint()
	if r.err == nil && (n == 0 || n > MaxProviderLen) {
		r.fail("provider name of %d bytes", n)
	}
	m.Provider = string(r.bytes(int(min(n, MaxProviderLen))))
	r.status(&m.Status)
	switch m.Type {
	case TypeDelta:
		nops := r.uvarint()
		if r.err == nil && (nops == 0 || nops > uint64(r.left())) {
			r.fail("%d ops", nops)
		}
		if r.err == nil {
			m.Ops = make([]Op, 0, min(nops, 64))
		}
		for i := uint64(0); i < nops && r.err == nil; i++ {
			m.Ops = append(m.Ops, r.op())
		}
	case TypeSnapshot:
		part, parts := r.uvarint(), r.uvarint()
		if r.err == nil && (parts == 0 || parts > maxParts || part >= parts) {
			r.fail("snapshot part %d of %d", part, parts)
		}
		m.Part, m.Parts = int(part), int(parts)
		m.IDs = r.ids(true)
	}
	if r.err == nil && r.left() > 0 {
		r.fail("%d trailing bytes", r.left())
	}
	return r.err
}

// reader reads b, remembering the first error.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format+" at offset %d", append([]any{ErrMalformed}, append(args, r.off)...)...)
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) u8() byte {
	if r.err != nil {
		return 0
	}
	if r.left() < 1 {
		r.fail("truncated")
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if r.left() < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.off += n
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if r.left() < n {
		r.fail("truncated")
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) duration(age bool) time.Duration {
	v := r.uvarint()
	if v > maxMillis {
		r.fail("duration of %d ms", v)
		return 0
	}
	if age {
		if v == 0 {
			return -1
		}
		v--
	}
	return time.Duration(v) * time.Millisecond
}

func (r *reader) count(what string, limit uint64) int {
	v := r.uvarint()
	if r.err == nil && v > limit {
		r.fail("%s %d", what, v)
	}
	return int(min(v, limit))
}

func (r *reader) status(s *Status) {
	f := r.u8()
	if f&^flagsKnown != 0 {
		r.fail("unknown status flags %#x", f)
	}
	s.KV, s.Synced, s.LM, s.LMAvailable = f&flagKV != 0, f&flagSynced != 0, f&flagLM != 0, f&flagLMAvailable != 0
	if s.KV {
		s.KVAge = r.duration(true)
		s.KVStale = r.duration(false)
		s.BlockSize = r.count("block size", math.MaxInt32)
		s.Blocks = r.count("block count", math.MaxInt32)
	}
	if s.LM {
		s.Occupancy = math.Float64frombits(r.u64())
		if r.err == nil && !(s.Occupancy >= 0 && s.Occupancy <= 1) {
			r.fail("occupancy %v", s.Occupancy)
		}
		s.LMAge = r.duration(true)
		s.LMStale = r.duration(false)
	}
}

func (r *reader) op() Op {
	op := Op{Kind: OpKind(r.u8())}
	switch op.Kind {
	case OpStored:
		switch r.u8() {
		case 0:
		case 1:
			op.HasParent = true
			op.Parent = r.u64()
		default:
			r.fail("bad has-parent byte")
		}
		op.IDs = r.ids(false)
	case OpRemoved:
		op.IDs = r.ids(false)
	case OpCleared:
		op.Reason = Reason(r.u8())
		if r.err == nil && (op.Reason < ReasonEngine || op.Reason > ReasonConfig) {
			r.fail("unknown clear reason %d", op.Reason)
		}
	default:
		r.fail("unknown op kind %d", op.Kind)
	}
	return op
}

// ids reads a counted list of u64s; empty lists are allowed only when
// allowEmpty.
func (r *reader) ids(allowEmpty bool) []uint64 {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(r.left()/8) {
		r.fail("%d ids in %d bytes", n, r.left())
		return nil
	}
	if n == 0 {
		if !allowEmpty {
			r.fail("empty id list")
		}
		return nil
	}
	ids := make([]uint64, n)
	p := r.b[r.off:]
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(p[8*i:])
	}
	r.off += 8 * int(n)
	return ids
}
