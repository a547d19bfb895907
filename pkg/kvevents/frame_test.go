package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func framesHex(fs [][]byte) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = hex.EncodeToString(f)
	}
	return out
}

func sameFrames(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestLiveFrames(t *testing.T) {
	// kv-events.md §6, vectors_extra.json: seq 5 and END_SEQ.
	if got := hex.EncodeToString(SeqFrame(5)); got != "0000000000000005" {
		t.Errorf("SeqFrame(5) = %s", got)
	}
	if got := hex.EncodeToString(SeqFrame(EndSeq)); got != "ffffffffffffffff" {
		t.Errorf("SeqFrame(EndSeq) = %s", got)
	}
	m := Message{Seq: 5, Payload: []byte{0x93}}
	fs := m.Frames()
	if len(fs) != 3 || fs[0] == nil || len(fs[0]) != 0 {
		t.Fatalf("Frames of an empty topic = %v: the topic frame must be sent, empty", framesHex(fs))
	}
	got, err := ParseMessage(fs)
	if err != nil || got.Seq != 5 || !bytes.Equal(got.Payload, m.Payload) || len(got.Topic) != 0 {
		t.Errorf("ParseMessage = %+v, %v", got, err)
	}
	got, err = ParseMessage(Message{Topic: []byte("kv@a@m"), Seq: 1 << 40, Payload: []byte{1}}.Frames())
	if err != nil || string(got.Topic) != "kv@a@m" || got.Seq != 1<<40 {
		t.Errorf("ParseMessage = %+v, %v", got, err)
	}
	bad := [][][]byte{
		nil,
		{[]byte("t"), SeqFrame(1)},
		{[]byte("t"), SeqFrame(1), {1}, {2}},
		{[]byte("t"), make([]byte, 7), {1}},
		{[]byte("t"), make([]byte, 9), {1}},
		{SeqFrame(1), {1}},
	}
	for _, b := range bad {
		if _, err := ParseMessage(b); !errors.Is(err, ErrBadFrames) {
			t.Errorf("ParseMessage(%v) = %v, want ErrBadFrames", framesHex(b), err)
		}
	}
}

func TestReplayFrames(t *testing.T) {
	req := ReplayRequest(7)
	if len(req) != 2 || len(req[0]) != 0 || hex.EncodeToString(req[1]) != "0000000000000007" {
		t.Errorf("ReplayRequest(7) = %v", framesHex(req))
	}
	// The ROUTER sees the DEALER's identity first.
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("peer")}, req...))
	if err != nil || string(id) != "peer" || start != 7 {
		t.Errorf("ParseReplayRequest = %q, %d, %v", id, start, err)
	}
	for _, b := range [][][]byte{
		req,
		{[]byte("peer"), {1}, SeqFrame(7)},
		{[]byte("peer"), {}, make([]byte, 4)},
		{[]byte("peer"), {}, SeqFrame(7), {}},
	} {
		if _, _, err := ParseReplayRequest(b); !errors.Is(err, ErrBadFrames) {
			t.Errorf("ParseReplayRequest(%v) = %v, want ErrBadFrames", framesHex(b), err)
		}
	}

	m := Message{Topic: []byte("kv"), Seq: 3, Payload: []byte{0x93, 1}}
	cases := []struct {
		format ReplayFormat
		reply  [][]byte
		end    [][]byte
	}{
		{ReplayWithTopic, [][]byte{{}, []byte("kv"), SeqFrame(3), {0x93, 1}}, [][]byte{{}, {}, SeqFrame(EndSeq), {}}},
		{ReplayLegacy, [][]byte{{}, SeqFrame(3), {0x93, 1}}, [][]byte{{}, SeqFrame(EndSeq), {}}},
	}
	for _, c := range cases {
		if got := ReplayReply(m, c.format); !sameFrames(got, c.reply) {
			t.Errorf("ReplayReply(%d) = %v, want %v", c.format, framesHex(got), framesHex(c.reply))
		}
		if got := ReplayEnd(c.format); !sameFrames(got, c.end) {
			t.Errorf("ReplayEnd(%d) = %v, want %v", c.format, framesHex(got), framesHex(c.end))
		}
		got, end, err := ParseReplayReply(c.reply)
		if err != nil || end || got.Seq != 3 || !bytes.Equal(got.Payload, m.Payload) {
			t.Errorf("ParseReplayReply(%v) = %+v, %v, %v", framesHex(c.reply), got, end, err)
		}
		if c.format == ReplayWithTopic && string(got.Topic) != "kv" {
			t.Errorf("topic %q", got.Topic)
		}
		if _, end, err := ParseReplayReply(c.end); err != nil || !end {
			t.Errorf("ParseReplayReply(end %v) = %v, %v", framesHex(c.end), end, err)
		}
	}
	// A sequence of all ones with a payload is not the end marker.
	if _, end, err := ParseReplayReply([][]byte{{}, SeqFrame(EndSeq), {1}}); err != nil || end {
		t.Errorf("EndSeq with a payload: end %v, %v", end, err)
	}
	for _, b := range [][][]byte{
		nil,
		{{}, SeqFrame(1)},
		{[]byte("x"), SeqFrame(1), {1}},
		{{}, make([]byte, 7), {1}},
		{{}, []byte("t"), make([]byte, 9), {1}},
		{{}, []byte("t"), SeqFrame(1), {1}, {2}},
	} {
		if _, _, err := ParseReplayReply(b); !errors.Is(err, ErrBadFrames) {
			t.Errorf("ParseReplayReply(%v) = %v, want ErrBadFrames", framesHex(b), err)
		}
	}
}
