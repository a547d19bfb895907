package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// EndSeq is the sequence number of the replay end marker (-1 as 8 bytes of
// 0xFF).
const EndSeq uint64 = math.MaxUint64

// ErrBadFrames is wrapped by the errors of the frame parsers: a message that
// is not laid out as vLLM lays it out (a watcher counts it as malformed).
var ErrBadFrames = errors.New("kvevents: malformed ZMQ message")

// Message is one published batch: the frames of a live PUB message, or one
// message of a replay.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
}

// SeqFrame returns the 8-byte big-endian sequence frame.
func SeqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }

// Frames returns the live message's frames: topic (sent even when empty),
// sequence, payload.
func (m Message) Frames() [][]byte {
	topic := m.Topic
	if topic == nil {
		topic = []byte{}
	}
	return [][]byte{topic, SeqFrame(m.Seq), m.Payload}
}

// ParseMessage parses the frames of a live message: exactly three frames,
// the second exactly 8 bytes. The Message aliases the frames.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%w: %d frames, want 3 (topic, seq, payload)", ErrBadFrames, len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrBadFrames, len(frames[1]))
	}
	return Message{Topic: frames[0], Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// ReplayRequest returns the frames a DEALER sends to ask a replay socket for
// the buffered batches from sequence start on: an empty delimiter and the
// 8-byte sequence. (A REQ socket adds the delimiter itself, but receives
// only the first reply, so use a DEALER.)
func ReplayRequest(start uint64) [][]byte { return [][]byte{{}, SeqFrame(start)} }

// ParseReplayRequest parses a request as the replay ROUTER receives it:
// exactly [identity, "", seq8]. vLLM ignores anything else.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return nil, 0, fmt.Errorf("%w: replay request is not [identity, \"\", seq8]", ErrBadFrames)
	}
	return frames[0], binary.BigEndian.Uint64(frames[2]), nil
}

// ReplayFormat is the layout of the replay replies.
type ReplayFormat uint8

const (
	// ReplayWithTopic is vLLM ≥ 0.26 (#45177): ["", topic, seq8, payload],
	// end marker ["", "", FF×8, ""].
	ReplayWithTopic ReplayFormat = iota
	// ReplayLegacy is vLLM ≤ 0.25: ["", seq8, payload], end marker
	// ["", FF×8, ""].
	ReplayLegacy
)

// ReplayReply returns the frames of one replayed message as the DEALER
// receives them; a ROUTER sends them after the requester's identity frame.
func ReplayReply(m Message, f ReplayFormat) [][]byte {
	if f == ReplayLegacy {
		return [][]byte{{}, SeqFrame(m.Seq), m.Payload}
	}
	topic := m.Topic
	if topic == nil {
		topic = []byte{}
	}
	return [][]byte{{}, topic, SeqFrame(m.Seq), m.Payload}
}

// ReplayEnd returns the frames of the end marker as the DEALER receives
// them.
func ReplayEnd(f ReplayFormat) [][]byte {
	return ReplayReply(Message{Seq: EndSeq, Payload: []byte{}}, f)
}

// ParseReplayReply parses a replay reply as a DEALER receives it, in either
// format: ["", topic, seq8, payload] or ["", seq8, payload]. end reports the
// end marker (sequence EndSeq, empty payload), after which no more replies
// come for the request. The Message aliases the frames.
func ParseReplayReply(frames [][]byte) (m Message, end bool, err error) {
	if len(frames) < 3 || len(frames) > 4 || len(frames[0]) != 0 {
		return Message{}, false, fmt.Errorf("%w: replay reply of %d frames is not [\"\", (topic,) seq8, payload]", ErrBadFrames, len(frames))
	}
	rest := frames[1:]
	if len(rest) == 3 {
		m.Topic, rest = rest[0], rest[1:]
	}
	if len(rest[0]) != 8 {
		return Message{}, false, fmt.Errorf("%w: replay sequence frame of %d bytes, want 8", ErrBadFrames, len(rest[0]))
	}
	m.Seq, m.Payload = binary.BigEndian.Uint64(rest[0]), rest[1]
	return m, m.Seq == EndSeq && len(m.Payload) == 0, nil
}
