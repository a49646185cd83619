package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// PortRange is the loopback ports the bench's simulated workers, their KV-cache event publishers,
// its routers and its oracle listen on, Lo to Hi inclusive; the zero value leaves the choice to
// the system.
type PortRange struct{ Lo, Hi int }

// ParsePortRange reads LO-HI, two ports from 1 to 65535 with LO ≤ HI.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	a, errLo := strconv.Atoi(strings.TrimSpace(lo))
	b, errHi := strconv.Atoi(strings.TrimSpace(hi))
	if !ok || errLo != nil || errHi != nil || a < 1 || b > 65535 || a > b {
		return PortRange{}, fmt.Errorf("--port-range %q: want LO-HI, two ports from 1 to 65535 with LO at most HI (e.g. 20000-20100)", s)
	}
	return PortRange{Lo: a, Hi: b}, nil
}

// Set reports whether the range confines the ports.
func (r PortRange) Set() bool { return r.Lo > 0 }

// Size is the number of ports in the range.
func (r PortRange) Size() int { return r.Hi - r.Lo + 1 }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// ports hands out loopback ports in a range, each once, in increasing order, skipping those
// already taken. A nil *ports leaves every choice to the system (port 0), and finds consecutive
// ports anywhere from 20000 up.
type ports struct {
	r    PortRange
	next int
}

// newPorts returns the ports of r, or nil when r is not set.
func newPorts(r PortRange) *ports {
	if !r.Set() {
		return nil
	}
	return &ports{r: r, next: r.Lo}
}

// errNoPorts says that the range has no free port left.
var errNoPorts = errors.New("no free loopback port left in --port-range")

// listen listens on the next free port.
func (p *ports) listen() (net.Listener, error) {
	if p == nil {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	for ; p.next <= p.r.Hi; p.next++ {
		if ln, err := net.Listen("tcp", loopback(p.next)); err == nil {
			p.next++
			return ln, nil
		}
	}
	return nil, fmt.Errorf("%w %s", errNoPorts, p.r)
}

// addrs returns n loopback addresses for listeners that others open: free when asked, and never
// handed out again.
func (p *ports) addrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		if p == nil {
			out[i] = "127.0.0.1:0"
			continue
		}
		ln, err := p.listen()
		if err != nil {
			return nil, err
		}
		out[i] = ln.Addr().String()
		ln.Close()
	}
	return out, nil
}

// startSims starts n simulated workers of cfg on addresses from addrs, the run's own when it has
// a port range.
func (p *ports) startSims(n int, cfg sim.Config) (*sim.Fleet, error) {
	addrs, err := p.addrs(n)
	if err != nil {
		what := "workers"
		if n == 1 {
			what = "worker"
		}
		return nil, fmt.Errorf("the simulated %s: %w", what, err)
	}
	return sim.Start(addrs, cfg)
}

// consecutive returns the first of n consecutive loopback ports, free when asked (listeners that
// others open at base+i): the next run of them in the range, or, without one, anywhere from
// 20000 up.
func (p *ports) consecutive(n int) (int, error) {
	if p == nil {
		for range 50 {
			if base := 20000 + rand.IntN(40000-n); allFree(base, n) {
				return base, nil
			}
		}
		return 0, fmt.Errorf("no %d consecutive free loopback ports", n)
	}
	for base := p.next; base+n-1 <= p.r.Hi; base++ {
		if allFree(base, n) {
			p.next = base + n
			return base, nil
		}
	}
	return 0, fmt.Errorf("%w %s for %d consecutive ports", errNoPorts, p.r, n)
}

// allFree reports whether the loopback ports base to base+n-1 can be listened on now.
func allFree(base, n int) bool {
	for port := base; port < base+n; port++ {
		ln, err := net.Listen("tcp", loopback(port))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
