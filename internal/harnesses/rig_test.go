package harnesses

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/router"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The pinned CLIs. .ci/run installs the same versions; change them together.
const (
	claudePackage = "@anthropic-ai/claude-code"
	claudeVersion = "2.1.332"
	codexPackage  = "@openai/codex"
	codexVersion  = "0.171.0"
)

// Bounds of the runs: one CLI invocation, and the npm install when the CLIs are missing.
const (
	runTimeout     = 4 * time.Minute
	installTimeout = 8 * time.Minute
)

// simWorkers is the fleet behind the router; model is the name it serves.
const (
	simWorkers = 4
	model      = "sim-model"
)

// cliPrefix is the npm prefix the CLIs live in: $CACHEROUTE_AGENT_CLIS, else .bin/agent-clis at
// the repository root (two levels above this package).
func cliPrefix(t *testing.T) string {
	if p := os.Getenv("CACHEROUTE_AGENT_CLIS"); p != "" {
		return p
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, ".bin", "agent-clis")
}

var (
	installOnce sync.Once
	installErr  error
)

// requireCLI returns the path of the named CLI binary of the pinned package, installing both
// pinned CLIs with npm first when either is missing or at another version. Without npm, or when
// the install fails, the test is skipped outside CI and fails in CI.
func requireCLI(t *testing.T, pkg, version, bin string) string {
	t.Helper()
	prefix := cliPrefix(t)
	installOnce.Do(func() {
		if installedVersion(prefix, claudePackage) == claudeVersion && installedVersion(prefix, codexPackage) == codexVersion {
			return
		}
		npm, err := exec.LookPath("npm")
		if err != nil {
			installErr = fmt.Errorf("npm is not on PATH: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "install", "--prefix", prefix, "--no-audit", "--no-fund",
			claudePackage+"@"+claudeVersion, codexPackage+"@"+codexVersion)
		if out, err := cmd.CombinedOutput(); err != nil {
			installErr = fmt.Errorf("npm install into %s: %w\n%s", prefix, err, tail(out, 2000))
		}
	})
	path := filepath.Join(prefix, "node_modules", ".bin", bin)
	var missing error
	switch {
	case installErr != nil:
		missing = installErr
	case installedVersion(prefix, pkg) != version:
		missing = fmt.Errorf("%s@%s is not in %s (found %q)", pkg, version, prefix, installedVersion(prefix, pkg))
	default:
		if _, err := os.Stat(path); err != nil {
			missing = err
		}
	}
	if missing != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s@%s is needed in CI: %v", pkg, version, missing)
		}
		t.Skipf("skipping: %s@%s is not available and npm could not install it (%v); run .ci/run or `npm install --prefix %s %s@%s`",
			pkg, version, missing, prefix, pkg, version)
	}
	return path
}

// installedVersion is the version of pkg in prefix, or "" when it is not installed.
func installedVersion(prefix, pkg string) string {
	b, err := os.ReadFile(filepath.Join(prefix, "node_modules", pkg, "package.json"))
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}

// trap is a loopback listener set as the CLIs' HTTP and HTTPS proxy. Nothing should reach it:
// every request to the router goes direct (NO_PROXY), so a connection here is a CLI trying to
// reach another host, which is refused and reported.
type trap struct {
	ln   net.Listener
	hits atomic.Int64
	mu   sync.Mutex
	seen []string // the first line each connection sent
}

func startTrap(t *testing.T) *trap {
	t.Helper()
	ln := testkit.Listen(t)
	tp := &trap{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tp.hits.Add(1)
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			tp.mu.Lock()
			tp.seen = append(tp.seen, strings.TrimSpace(line))
			tp.mu.Unlock()
			_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return tp
}

func (tp *trap) url() string { return "http://" + tp.ln.Addr().String() }

// check fails the test when anything went to the trap.
func (tp *trap) check(t *testing.T) {
	t.Helper()
	if n := tp.hits.Load(); n > 0 {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		t.Errorf("a CLI tried to leave the machine %d times through the proxy: %q", n, tp.seen)
	}
}

// rig is a router with the given policy in front of simWorkers sims, on loopback, with its access
// log in a file.
type rig struct {
	fleet     *sim.Fleet
	url       string
	accessLog string
	trap      *trap
}

func startRig(t *testing.T, policy string) *rig {
	t.Helper()
	simCfg := sim.DefaultConfig() // the defaults a user gets: natural reply lengths, harmless tool calls
	simCfg.Models = []string{model}
	simCfg.TimeScale = 0
	fleet, err := sim.StartLocal(simWorkers, simCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close) // after the router's cleanup: cleanups run last first

	cfg := config.Default()
	cfg.Policy = policy
	cfg.WorkerURLs = fleet.URLs()
	cfg.PrometheusPort = 0
	cfg.AccessLog = filepath.Join(t.TempDir(), "access.log")
	r, err := router.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	r.Start(ctx)
	testkit.Go(t, cancel, func() error { return r.Serve(ctx, ln, nil) })
	for _, w := range r.Pool().All() {
		if !w.Healthy() {
			t.Fatalf("worker %s did not answer its health check", w.ID())
		}
	}
	return &rig{fleet: fleet, url: "http://" + ln.Addr().String(), accessLog: cfg.AccessLog, trap: startTrap(t)}
}

// logLine is an access log line, read back as the router wrote it.
type logLine = telemetry.Entry

// generations returns the access log's lines of generation requests (route), in order.
func (rg *rig) generations(t *testing.T, route string) []logLine {
	t.Helper()
	b, err := os.ReadFile(rg.accessLog)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []logLine
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l logLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("access log line %q: %v", line, err)
		}
		if l.Route == route {
			out = append(out, l)
		}
	}
	return out
}

// waitForLog waits until the access log holds at least n generation lines: a line is written
// when its request ends, which may be just after the CLI has exited.
func (rg *rig) waitForLog(t *testing.T, route string, n int) []logLine {
	t.Helper()
	var lines []logLine
	testkit.Poll(testkit.Patience, 20*time.Millisecond, func() bool {
		lines = rg.generations(t, route)
		return len(lines) >= n
	})
	return lines
}

// simRequests is the number of generation requests each sim worker served.
func (rg *rig) simRequests() []int64 {
	var out []int64
	for _, w := range rg.fleet.Workers() {
		out = append(out, w.Stats().Requests)
	}
	return out
}

// baseEnv is the environment every CLI runs in: a fresh HOME, no proxy but the trap for anything
// that is not loopback, no colour, and nothing of this process's environment but PATH.
func (rg *rig) baseEnv(home string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"TMPDIR=" + filepath.Join(home, "tmp"),
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"LANG=C.UTF-8",
		"NO_COLOR=1",
		"HTTP_PROXY=" + rg.trap.url(), "HTTPS_PROXY=" + rg.trap.url(), "ALL_PROXY=" + rg.trap.url(),
		"http_proxy=" + rg.trap.url(), "https_proxy=" + rg.trap.url(), "all_proxy=" + rg.trap.url(),
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
	}
}

// newHome makes a temporary HOME with a small project directory in it, and returns both.
func newHome(t *testing.T) (home, project string) {
	t.Helper()
	home = t.TempDir()
	project = filepath.Join(home, "project")
	for _, d := range []string{project, filepath.Join(home, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	readme := "# demo\n\nA small project the agent looks at.\n"
	if err := os.WriteFile(filepath.Join(project, "README.md"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	return home, project
}

// run runs one CLI invocation in dir with env, bounded by runTimeout, and fails the test unless it
// exits 0. Where strace is installed the run is traced, and every address the CLI or its children
// connected or sent to must be a loopback one (watchNetwork).
func run(t *testing.T, dir string, env []string, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	name, argv := bin, args
	var trace string
	strace, err := exec.LookPath("strace")
	switch {
	case err == nil && os.Getenv("CACHEROUTE_AGENT_STRACE") != "0":
		trace = filepath.Join(t.TempDir(), "strace.out")
		name, argv = strace, append([]string{"-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", trace, bin}, args...)
	case err != nil && os.Getenv("CI") == "true":
		t.Fatalf("strace is needed in CI to watch the CLIs' network calls (.ci/run installs it): %v", err)
	}
	defer func() {
		if trace != "" {
			watchNetwork(t, trace)
		}
	}()
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, env, nil
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %q did not finish within %v\nstdout: %s\nstderr: %s", filepath.Base(bin), args, runTimeout, tail(stdout.Bytes(), 2000), tail(stderr.Bytes(), 2000))
	}
	if err != nil {
		t.Fatalf("%s %q: %v\nstdout: %s\nstderr: %s", filepath.Base(bin), args, err, tail(stdout.Bytes(), 2000), tail(stderr.Bytes(), 2000))
	}
	return stdout.String()
}

// inetAddr finds the IPv4 and IPv6 addresses of a strace line: sin_addr=inet_addr("…") and
// inet_pton(AF_INET6, "…", …).
var inetAddr = regexp.MustCompile(`inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"`)

// watchNetwork fails the test for every address in the strace output at path that is not on the
// loopback (the CLIs must reach nothing but the router, DNS queries to a resolver included), and
// when the trace holds no address at all, which would mean it traced nothing.
func watchNetwork(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("reading the trace of the CLI's network calls: %v", err)
		return
	}
	loopback, others := tracedAddresses(b)
	for _, line := range others {
		t.Errorf("a CLI reached for an address not on the loopback: %s", line)
	}
	if loopback == 0 && len(others) == 0 {
		t.Errorf("the trace of the CLI's network calls holds no address: was it traced?")
	}
}

// tracedAddresses counts the loopback addresses of strace output and returns its lines with any
// other address.
func tracedAddresses(trace []byte) (loopback int, others []string) {
	for _, line := range strings.Split(string(trace), "\n") {
		for _, m := range inetAddr.FindAllStringSubmatch(line, -1) {
			if ip, err := netip.ParseAddr(m[1] + m[2]); err == nil && ip.Unmap().IsLoopback() {
				loopback++
			} else {
				others = append(others, line)
			}
		}
	}
	return loopback, others
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// turn is what one CLI invocation sent: its generation requests as the access log has them.
type turn struct {
	lines []logLine
}

func (tn turn) maxCached() int {
	m := 0
	for _, l := range tn.lines {
		if l.CachedTokens != nil {
			m = max(m, *l.CachedTokens)
		}
	}
	return m
}

func (tn turn) cached() []int {
	var out []int
	for _, l := range tn.lines {
		c := -1
		if l.CachedTokens != nil {
			c = *l.CachedTokens
		}
		out = append(out, c)
	}
	return out
}

// session runs the turns (each a function that runs one CLI invocation) through rg and returns
// what each sent.
func (rg *rig) session(t *testing.T, route string, turns []func()) []turn {
	t.Helper()
	var out []turn
	seen := 0
	for i, run := range turns {
		run()
		lines := rg.waitForLog(t, route, seen+1)
		if len(lines) <= seen {
			t.Fatalf("turn %d sent no %s request through the router", i+1, route)
		}
		out = append(out, turn{lines: lines[seen:]})
		seen = len(lines)
	}
	return out
}

// report logs a session's figures (requests, their workers, cached tokens per turn) and returns
// the share of its generation requests on its busiest worker.
func report(t *testing.T, name, policy string, turns []turn, simRequests []int64) float64 {
	t.Helper()
	perWorker := map[string]int{}
	total, prompt, cached := 0, 0, 0
	for i, tn := range turns {
		for _, l := range tn.lines {
			if l.PromptTokens != nil && l.CachedTokens != nil {
				prompt, cached = prompt+*l.PromptTokens, cached+*l.CachedTokens
			}
		}
		var workers, decisions []string
		for _, l := range tn.lines {
			perWorker[l.Worker]++
			workers = append(workers, l.Worker)
			decisions = append(decisions, l.Decision)
			total++
		}
		slices.Sort(workers)
		t.Logf("%s via %s: turn %d: %d requests, workers %v, decisions %v, cached tokens per request %v (max %d)",
			name, policy, i+1, len(tn.lines), slices.Compact(workers), decisions, tn.cached(), tn.maxCached())
	}
	top := 0
	for _, n := range perWorker {
		top = max(top, n)
	}
	share := float64(top) / float64(total)
	hit := 0.0
	if prompt > 0 {
		hit = float64(cached) / float64(prompt)
	}
	t.Logf("%s via %s: %d requests in the session, %.0f%% on its busiest worker (%d workers used), sim requests per worker %v, %d of %d prompt tokens cached (%.0f%%)",
		name, policy, total, 100*share, len(perWorker), simRequests, cached, prompt, 100*hit)
	return share
}

// checkStickyAndCached asserts what cache_aware promises a session: every generation request on
// one worker (by the access log and by the sims' own counts), and a cache hit that grows turn by
// turn as the conversation does.
func checkStickyAndCached(t *testing.T, turns []turn, simRequests []int64) {
	t.Helper()
	workers := map[string]bool{}
	total := 0
	for _, tn := range turns {
		for _, l := range tn.lines {
			workers[l.Worker] = true
			total++
			if l.Status != 200 {
				t.Errorf("a request ended with status %d: %+v", l.Status, l)
			}
		}
	}
	if len(workers) != 1 {
		t.Errorf("the session's %d requests went to %d workers %v, want one", total, len(workers), workers)
	}
	busy := 0
	for _, n := range simRequests {
		if n > 0 {
			busy++
		}
	}
	if busy != 1 {
		t.Errorf("sim requests per worker %v, want all on one worker", simRequests)
	}
	for i := 1; i < len(turns); i++ {
		if turns[i].maxCached() <= turns[i-1].maxCached() {
			t.Errorf("turn %d hit at most %d cached tokens, turn %d %d: want the hit to grow with the conversation",
				i+1, turns[i].maxCached(), i, turns[i-1].maxCached())
		}
	}
}

// sessionUnderEachPolicy runs, for each of policies() in a subtest, one session of the CLI name:
// a new rig routing by that policy, a new home and project, and the turns session returns for
// them (each a function that runs one invocation, sending its requests to route). It logs the
// session's figures, fails on anything that got past the router to the trap, and under
// cache_aware checks what that policy promises a session (checkStickyAndCached).
func sessionUnderEachPolicy(t *testing.T, name, route string, session func(t *testing.T, rg *rig, home, project string) []func()) {
	for _, policy := range policies() {
		t.Run(policy, func(t *testing.T) {
			rg := startRig(t, policy)
			home, project := newHome(t)
			got := rg.session(t, route, session(t, rg, home, project))
			report(t, name, policy, got, rg.simRequests())
			rg.trap.check(t)
			if policy == "cache_aware" {
				checkStickyAndCached(t, got, rg.simRequests())
			}
		})
	}
}

// policies are the policies the tests run each CLI through: cache_aware, plus those listed in
// $CACHEROUTE_AGENT_POLICIES (comma-separated, e.g. round_robin) for a comparison of the figures
// the tests log. Only cache_aware is held to one worker and a growing cache hit.
func policies() []string {
	ps := []string{"cache_aware"}
	for _, p := range strings.Split(os.Getenv("CACHEROUTE_AGENT_POLICIES"), ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}
