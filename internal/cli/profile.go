package cli

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// profiles writes the CPU profile of a command's run to cpu and its allocation profile (every
// allocation since the start, by size and count) to allocs; an empty name writes none. They are
// for finding where the bench's in-process routers spend their time (docs/performance.md):
// `go tool pprof -top -cum FILE`.
type profiles struct {
	cpu, allocs string
	cpuFile     *os.File
}

// start starts the CPU profile, if asked. The allocation profile needs no start: the runtime
// samples allocations always (runtime.MemProfileRate).
func (p *profiles) start() error {
	if p.cpu == "" {
		return nil
	}
	f, err := os.Create(p.cpu)
	if err != nil {
		return fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--cpu-profile: %w", err)
	}
	p.cpuFile = f
	return nil
}

// stop ends the CPU profile and writes the allocation profile.
func (p *profiles) stop() error {
	var errs []error
	if p.cpuFile != nil {
		pprof.StopCPUProfile()
		errs = append(errs, p.cpuFile.Close())
	}
	if p.allocs != "" {
		runtime.GC() // the profile's figures are as of the last collection
		f, err := os.Create(p.allocs)
		if err != nil {
			return fmt.Errorf("--allocs-profile: %w", err)
		}
		errs = append(errs, pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
	}
	return errors.Join(errs...)
}
