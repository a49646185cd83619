package bench

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParsePortRange(t *testing.T) {
	good := map[string]PortRange{"20000-20100": {20000, 20100}, " 1-1 ": {1, 1}, "40000 - 40010": {40000, 40010}, "1-65535": {1, 65535}}
	for in, want := range good {
		if got, err := ParsePortRange(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "20000", "20100-20000", "0-10", "1-65536", "a-b", "20000-", "-20000", "1-2-3"} {
		if _, err := ParsePortRange(in); err == nil || !strings.Contains(err.Error(), "--port-range") {
			t.Errorf("%q: accepted (%v)", in, err)
		}
	}
}

// listeningPorts returns the TCP ports this process listens on, from the sockets of its open
// files matched in /proc/net/tcp and tcp6 (Linux).
func listeningPorts(t *testing.T) map[int]bool {
	t.Helper()
	inodes := map[string]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	out := map[int]bool{}
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fields[1], ":")
			if port, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				out[int(port)] = true
			}
		}
		f.Close()
	}
	return out
}

// With a port range, every port the run listens on is in it: the simulated workers, their event
// publishers, each entry's router and the oracle, as this process's listening sockets show them
// while the run goes on.
func TestPortRangeConfinesEveryListenerOfTheRun(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the process's sockets from /proc")
	}
	before := listeningPorts(t)
	base, err := (*ports)(nil).consecutive(40)
	if err != nil {
		t.Fatal(err)
	}
	r := PortRange{Lo: base, Hi: base + 39}
	w := tinyAgent(t, 4, 3)
	simCfg := scaledSim(0.05)
	policies := mustPolicies(t, []string{"round_robin,cache_aware," + OraclePolicy}, SessionHeader)

	var mu sync.Mutex
	seen := map[int]bool{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			ports := listeningPorts(t)
			mu.Lock()
			for p := range ports {
				seen[p] = true
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	rep, err := Run(t.Context(), Options{Workload: w, Policies: policies, Workers: 3, Sim: simCfg, KVEvents: true,
		Concurrency: 2, Timeout: 30 * time.Second, Ports: r})
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	inRange := func(port int) bool { return port >= r.Lo && port <= r.Hi }
	for p := range seen {
		if !before[p] && !inRange(p) {
			t.Errorf("the run listened on port %d, outside %s", p, r)
		}
	}
	// 3 workers, 3 event publishers, 2 routers and the oracle.
	if n := len(seen) - len(before); n < 9 {
		t.Errorf("saw %d listeners of the run, want 9 at least: %v", n, seen)
	}
	for _, tr := range rep.Targets {
		for _, u := range tr.URLs {
			if port, _ := strconv.Atoi(u[strings.LastIndex(u, ":")+1:]); !inRange(port) {
				t.Errorf("%s listened on %s", tr.Name, u)
			}
		}
		for wu := range tr.WorkerShare {
			if port, _ := strconv.Atoi(wu[strings.LastIndex(wu, ":")+1:]); !inRange(port) {
				t.Errorf("worker %s outside %s", wu, r)
			}
		}
	}
}

// A range too small for the run is refused before anything starts, naming both sizes.
func TestPortRangeTooSmallIsRefusedBeforeTheRun(t *testing.T) {
	policies, _ := ParsePolicies(DemoPolicies, SessionHeader)
	_, err := Run(t.Context(), Options{Workload: tinyAgent(t, 1, 1), Policies: policies, Workers: DemoWorkers, Sim: DemoSim(), KVEvents: true,
		Concurrency: 1, Ports: PortRange{Lo: 20000, Hi: 20009}})
	if err == nil || !strings.Contains(err.Error(), "holds 10 ports; this run listens on 12") {
		t.Fatalf("err %v", err)
	}
}

// tinyAgent is an agent workload of short sessions with little shared prefix.
func tinyAgent(t *testing.T, sessions, turns int) Workload {
	t.Helper()
	return shortAgent(t, sessions, turns, 5)
}
