// Package porttest picks loopback ports for servers a test starts later, on
// an address something must know first (a client started before its server,
// a server restarted on the same address).
//
// A port taken from a listener on port 0 lies in the kernel's ephemeral
// range, and between closing that listener and the server binding the port,
// any other socket bound to port 0 (the test's other servers, a package
// tested in parallel) can take it: "bind: address already in use". The ports
// here come from below the ephemeral ranges of Linux (32768–60999), macOS and
// Windows (49152–65535), where only an explicit bind lands. (FreeBSD's range
// starts at 10000 by default: there the race stays, as rare as before.)
package porttest

import (
	"fmt"
	"math/rand/v2"
	"net"
)

// TB is the part of testing.TB the helpers use (so that this package, not
// being a test, does not import testing).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// The range the ports are drawn from: registered ports below the ephemeral
// ranges.
const (
	low  = 20000
	high = 32768 // exclusive
)

// Free returns the first of n consecutive loopback ports, all free now.
func Free(t TB, n int) int {
	t.Helper()
	if n < 1 || n > high-low {
		t.Fatal(fmt.Sprintf("porttest: %d ports", n))
		return 0
	}
	for range 100 {
		base := low + rand.IntN(high-low-n+1)
		if bindable(base, n) {
			return base
		}
	}
	t.Fatal(fmt.Sprintf("porttest: no %d free consecutive ports in [%d, %d)", n, low, high))
	return 0
}

// Addr returns a loopback address ("127.0.0.1:port") free now.
func Addr(t TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Free(t, 1))
}

// bindable reports whether ports base … base+n−1 can all be bound now.
func bindable(base, n int) bool {
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		lns = append(lns, l)
	}
	return true
}
