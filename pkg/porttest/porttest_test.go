package porttest

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestFreePortsBindOutsideTheEphemeralRange(t *testing.T) {
	base := Free(t, 4)
	if base < low || base+4 > high {
		t.Fatalf("ports %d–%d outside [%d, %d)", base, base+3, low, high)
	}
	for p := base; p < base+4; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d of the run: %v", p, err)
		}
		l.Close()
	}
	addr := Addr(t)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("addr %q", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A port in use is never handed out.
	held := l.Addr().(*net.TCPAddr).Port
	if bindable(held, 1) {
		t.Fatalf("port %d reported bindable while held", held)
	}
}

type fatalRecorder struct{ msg string }

func (f *fatalRecorder) Helper()           {}
func (f *fatalRecorder) Fatal(args ...any) { f.msg = fmt.Sprint(args...) }

func TestFreeRejectsImpossibleRuns(t *testing.T) {
	for _, n := range []int{0, -1, high - low + 1} {
		var f fatalRecorder
		Free(&f, n)
		if !strings.Contains(f.msg, "ports") {
			t.Errorf("Free(%d): fatal %q", n, f.msg)
		}
	}
}
