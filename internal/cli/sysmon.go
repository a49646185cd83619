package cli

import (
	"os"
	"strings"
	"syscall"
)

// The Go runtime's system monitor (sysmon, a thread of its own) sleeps until the next timer
// while no goroutine runs, and the first system call after that wakes it and sets it polling
// every 20 µs, for a millisecond and more, before it backs off again (runtime/proc.go, sysmon: a
// bet that a program which just woke is about to need it). A router relaying streamed tokens is
// idle for a millisecond at a time between them, so every token woke the monitor and paid for a
// train of 20 µs sleeps: measured on one router relaying 16-token answers, about half of its CPU
// per request (docs/performance.md). The runtime leaves out the deep sleep only when GODEBUG's
// schedtrace is set: the monitor then keeps the period it backed off to, up to 10 ms.
//
// schedtrace also prints the scheduler's state every so many milliseconds of the monotonic
// clock; the largest value it takes, 2^31-1 ms (24.8 days), makes that one line to stderr per
// 24.8 days of the host's uptime (at start on a host up longer).
const sysmonAwake = "schedtrace=2147483647"

// withSysmonAwake returns env with sysmonAwake added to its GODEBUG, and true; or env as it is,
// and false, when its GODEBUG already sets schedtrace (GODEBUG=schedtrace=0 keeps the runtime's
// default).
func withSysmonAwake(env []string) ([]string, bool) {
	for i, kv := range env {
		value, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		for setting := range strings.SplitSeq(value, ",") {
			if strings.HasPrefix(setting, "schedtrace=") {
				return env, false
			}
		}
		out := append([]string{}, env...)
		if value == "" {
			out[i] = "GODEBUG=" + sysmonAwake
		} else {
			out[i] = kv + "," + sysmonAwake
		}
		return out, true
	}
	return append(append([]string{}, env...), "GODEBUG="+sysmonAwake), true
}

// keepSysmonAwake runs the program again in place of itself (the same process, arguments and
// open files) with sysmonAwake in its GODEBUG, which the runtime reads only at start. It returns
// when GODEBUG already sets schedtrace, or when the program cannot be run again; the program
// then goes on as it is.
func keepSysmonAwake() {
	env, changed := withSysmonAwake(os.Environ())
	if !changed {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env) // returns only on failure
}
