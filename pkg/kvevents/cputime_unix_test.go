//go:build unix

package kvevents

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time the process has used (user and system), so
// that benchmarks can report a rate per CPU second that a loaded machine
// does not distort as much as wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
