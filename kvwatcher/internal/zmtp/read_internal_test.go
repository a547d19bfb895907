package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// frame encodes one ZMTP 3 frame: a short size when it fits a byte, else
// a long one, as a publisher would write it.
func frame(more, command bool, body []byte) []byte {
	var flags byte
	if more {
		flags |= flagMore
	}
	if command {
		flags |= flagCommand
	}
	if len(body) <= 255 {
		return append([]byte{flags, byte(len(body))}, body...)
	}
	b := make([]byte, 9, 9+len(body))
	b[0] = flags | flagLong
	binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
	return append(b, body...)
}

// reader is a Conn reading b, for read alone (no handshake, no commands
// answered).
func reader(b []byte) *Conn {
	return &Conn{br: bufio.NewReader(bytes.NewReader(b)), Remote: "test"}
}

// TestReadFrames: messages of several frames, long sizes, commands, too
// many frames (kept up to maxFrames and marked by a nil frame) and a frame
// over MaxFrame (refused before it is read).
func TestReadFrames(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 300)
	var in []byte
	in = append(in, frame(true, false, []byte("topic"))...)
	in = append(in, frame(true, false, []byte{0, 0, 0, 0, 0, 0, 0, 7})...)
	in = append(in, frame(false, false, long)...)
	in = append(in, frame(false, true, []byte("\x04PING\x00\x10ctx"))...)
	for i := range maxFrames + 2 {
		in = append(in, frame(i < maxFrames+1, false, []byte{byte(i)})...)
	}
	c := reader(in)
	frames, cmd, err := c.read()
	if err != nil || cmd || len(frames) != 3 || string(frames[0]) != "topic" || !bytes.Equal(frames[2], long) {
		t.Fatalf("message 1: %q, %v, %v", frames, cmd, err)
	}
	if frames, cmd, err = c.read(); err != nil || !cmd || len(frames) != 1 {
		t.Fatalf("command: %q, %v, %v", frames, cmd, err)
	}
	if frames, _, err = c.read(); err != nil || len(frames) != maxFrames+1 || frames[maxFrames] != nil || frames[maxFrames-1][0] != maxFrames-1 {
		t.Fatalf("too many frames: %q, %v", frames, err)
	}
	var huge [9]byte
	huge[0] = flagLong
	binary.BigEndian.PutUint64(huge[1:], MaxFrame+1)
	if _, _, err := reader(huge[:]).read(); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a frame over MaxFrame: %v", err)
	}
}

// FuzzRead: read takes bytes from a peer (an engine, or anything that
// connects to a bound endpoint). Whatever they are it returns an error or a
// message of at most maxFrames frames (plus the nil marker of dropped
// ones), none over MaxFrame, never panics, and a data message it returns
// reads back the same when encoded again.
func FuzzRead(f *testing.F) {
	f.Add(append(frame(true, false, []byte("kv@0")), frame(false, false, []byte("payload"))...))
	f.Add(frame(false, true, []byte("\x04PING\x00\x01")))
	f.Add([]byte{flagLong, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{flagMore, 3, 'a'})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := reader(in)
		for range 4 {
			frames, cmd, err := c.read()
			if err != nil {
				return
			}
			if len(frames) == 0 || len(frames) > maxFrames+1 {
				t.Fatalf("%d frames", len(frames))
			}
			for i, fr := range frames {
				if len(fr) > MaxFrame || fr == nil && i != maxFrames {
					t.Fatalf("frame %d of %d: %d bytes, nil %v", i, len(frames), len(fr), fr == nil)
				}
			}
			// A command ends its message (one that follows data frames is
			// malformed, and Recv skips it); dropped frames are not read
			// back.
			if cmd || frames[len(frames)-1] == nil {
				continue
			}
			var again []byte
			for i, fr := range frames {
				again = append(again, frame(i < len(frames)-1, false, fr)...)
			}
			back, bcmd, err := reader(again).read()
			if err != nil || bcmd || len(back) != len(frames) {
				t.Fatalf("read back %q, %v, %v; want %q", back, bcmd, err, frames)
			}
			for i := range back {
				if !bytes.Equal(back[i], frames[i]) {
					t.Fatalf("frame %d read back %q, want %q", i, back[i], frames[i])
				}
			}
		}
	})
}
