package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The command tree is built in one place, newRootCommand; a subcommand missing from it, or one
// added twice, shows here.
func TestRootHasExactlyTheSubcommands(t *testing.T) {
	var got []string
	for _, c := range newRootCommand().Commands() {
		got = append(got, c.Name())
	}
	slices.Sort(got)
	if want := []string{"bench", "demo", "sim", "version"}; !slices.Equal(got, want) {
		t.Errorf("subcommands %q, want %q", got, want)
	}
}

// run executes the command line in-process and returns its error and output.
func run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errOut testkit.SyncBuffer
	err = Execute(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// takenPort holds a loopback port for the rest of the test and returns it.
func takenPort(t *testing.T) string {
	t.Helper()
	ln := testkit.Listen(t)
	t.Cleanup(func() { ln.Close() })
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func TestVersionFlagAndVersionCommandPrintTheBuildInfo(t *testing.T) {
	flag, _, err := run(context.Background(), "--version")
	if err != nil {
		t.Fatal(err)
	}
	cmd, _, err := run(context.Background(), "version")
	if err != nil {
		t.Fatal(err)
	}
	short, _, err := run(context.Background(), "-V") // the vLLM router's spelling
	if err != nil {
		t.Fatal(err)
	}
	if flag != cmd || short != cmd {
		t.Errorf("--version printed %q, -V %q, version %q", flag, short, cmd)
	}
	if !strings.HasPrefix(flag, "cacheroute ") || !strings.Contains(flag, runtime.Version()) {
		t.Errorf("version output %q, want the module version and %s", flag, runtime.Version())
	}
}

func TestVersionShowsModuleVersionRevisionTimeAndGoVersion(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/cacheroute/cacheroute", Version: "v0.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0217f5d1c2e4b6a8d0f1e3c5a7b9d1f3e5a7c9b1"},
			{Key: "vcs.time", Value: "2026-12-01T05:34:14Z"},
			{Key: "vcs.modified", Value: "true"},
		}}
	want := "cacheroute v0.4.0\nrevision 0217f5d1c2e4b6a8d0f1e3c5a7b9d1f3e5a7c9b1 (2026-12-01T05:34:14Z, modified)\ngo1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH
	if got := formatVersion(info, nil); got != want {
		t.Errorf("formatVersion =\n%s\nwant\n%s", got, want)
	}
	// The toolchain's stamps win over the linker's, which a build without stamps shows instead.
	linker := []debug.BuildSetting{{Key: "vcs.revision", Value: "5a84c9a0"}, {Key: "vcs.time", Value: "2026-12-02T10:00:00Z"}, {Key: "vcs.modified", Value: ""}}
	if got := formatVersion(info, linker); got != want {
		t.Errorf("formatVersion with both =\n%s\nwant\n%s", got, want)
	}
	info.Settings = nil
	if got, want := formatVersion(info, linker), "\nrevision 5a84c9a0 (2026-12-02T10:00:00Z)\n"; !strings.Contains(got, want) {
		t.Errorf("formatVersion with the linker's revision = %q, want %q in it", got, want)
	}
	// A build that recorded nothing says so.
	if got := formatVersion(info, nil); !strings.Contains(got, "\nrevision unknown: this build recorded none") {
		t.Errorf("formatVersion without a revision = %q", got)
	}
	if got := formatVersion(nil, nil); !strings.Contains(got, "cacheroute unknown") || !strings.Contains(got, runtime.Version()) {
		t.Errorf("formatVersion(nil) = %q", got)
	}
}

// `make build` records the checkout's revision in the binary whatever the toolchain stamps: in a
// git worktree, or with GOFLAGS=-buildvcs=false, `go build` records none by itself.
func TestMakeBuildRecordsTheRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("needs " + tool)
		}
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skip("not in a git checkout")
	}
	bin := filepath.Join(t.TempDir(), "cacheroute")
	build := exec.Command("make", "-s", "-C", filepath.Join("..", ".."), "build", "OUT="+bin)
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "\nrevision " + strings.TrimSpace(string(head)) + " (20"; !strings.Contains(string(out), want) {
		t.Errorf("version of the binary make built:\n%s\nwant %q in it", out, want)
	}
}

func TestWorkerURLsWithEqualsThenASpaceExplainsBothForms(t *testing.T) {
	_, _, err := run(context.Background(), "--worker-urls=http://a:8000", "http://b:8000", "--port", "0")
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{"--worker-urls http://a:8000 http://b:8000", "--worker-urls=http://a:8000,http://b:8000"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not show %q", msg, want)
		}
	}
	if strings.Contains(msg, "unknown command") {
		t.Errorf("error %q speaks of a command", msg)
	}
	// The forms that work are left alone, and so is a subcommand after the flag.
	for _, args := range [][]string{
		{"--worker-urls=http://a:8000,http://b:8000", "--port", "1"},
		{"--worker-urls", "http://a:8000", "http://b:8000"},
		{"--worker-urls=http://a:8000", "bench"},
		{"--", "--worker-urls=http://a:8000", "x"},
	} {
		if err := checkEqualsForm(args, []string{"bench", "sim"}); err != nil {
			t.Errorf("checkEqualsForm(%q): %v", args, err)
		}
	}
}

func TestAStrayArgumentIsNamedWithTheSubcommands(t *testing.T) {
	_, _, err := run(context.Background(), "--allow-empty", "serve")
	if err == nil || !strings.Contains(err.Error(), `unexpected argument "serve"`) || !strings.Contains(err.Error(), "version") {
		t.Fatalf("error %v, want the argument and the subcommands named", err)
	}
}

func TestStartingWithNoWorkerAndNoDiscoveryIsAnError(t *testing.T) {
	_, _, err := run(context.Background(), "--port", "0", "--prometheus-port", "0")
	if err == nil || !strings.Contains(err.Error(), "no workers") || !strings.Contains(err.Error(), "--allow-empty") {
		t.Fatalf("error %v, want one that names --worker-urls and --allow-empty", err)
	}
}

// With --allow-empty the router starts empty and takes its workers through the admin API.
func TestAllowEmptyStartsARouterThatTakesWorkersThroughTheAdminAPI(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
		}
	}))
	t.Cleanup(worker.Close)
	port := strconv.Itoa(testkit.FreePort(t)) // free a moment ago, released for the router to take
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs testkit.SyncBuffer
	go func() {
		done <- Execute(ctx, []string{"--allow-empty", "--port", port, "--prometheus-port", "0", "--shutdown-grace-secs", "1"}, &logs, &logs)
	}()
	base := "http://127.0.0.1:" + port
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/liveness")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the router stopped: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the router did not answer: %v\n%s", err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Post(base+"/workers", "application/json", strings.NewReader(fmt.Sprintf(`{"url":%q}`, worker.URL)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /workers: %d", resp.StatusCode)
	}
	resp, err = http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var health struct {
		Counts map[string]int `json:"worker_counts"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || health.Counts["healthy"] != 1 {
		t.Errorf("/health %d %v after adding a worker, want 200 with 1 healthy", resp.StatusCode, health.Counts)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the router did not stop")
	}
}

// A port already taken is reported under the flag that chose it, the metrics listener's with the
// way to turn it off: a second router on one host meets the default --prometheus-port without
// having chosen it.
func TestBindErrorsNameTheFlagOfTheListener(t *testing.T) {
	taken := takenPort(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"traffic port", []string{"--port", taken, "--prometheus-port", "0"}, "address already in use (--port)"},
		{"metrics port", []string{"--port", "0", "--prometheus-port", taken},
			"address already in use (--prometheus-port; 0 disables the metrics listener)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(context.Background(), append([]string{"--allow-empty", "--log-level", "error"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "127.0.0.1:"+taken) {
				t.Fatalf("error %v, want the address and %q", err, tc.want)
			}
		})
	}
	// An address this host does not have is the host flag's (and the port's) business.
	_, _, err := run(context.Background(), "--allow-empty", "--host", "192.0.2.1", "--port", "0", "--prometheus-port", "0")
	if err == nil || !strings.Contains(err.Error(), "(--host, --port)") {
		t.Fatalf("error %v, want --host named", err)
	}
}

// A mistyped flag is answered with the closest flags of its command, and a mistyped subcommand
// with the closest subcommand, as cobra answers an unknown subcommand of a command that has no
// flags of its own to parse.
func TestMistypedFlagsAndSubcommandsGetTheClosestNames(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--polcy", "round_robin"}, "Did you mean this?\n\t--policy"},
		{[]string{"--worker-url", "http://127.0.0.1:1"}, "\t--worker-urls"},
		{[]string{"sim", "--prot", "1"}, "\t--port"},
		{[]string{"bnech"}, "Did you mean this?\n\tbench"},
	} {
		_, _, err := run(context.Background(), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q in it", tc.args, err, tc.want)
		}
	}
	// Nothing near: the error alone, no empty suggestion.
	if _, _, err := run(context.Background(), "--zzzzzzzzzzzz"); err == nil || strings.Contains(err.Error(), "Did you mean") {
		t.Errorf("--zzzzzzzzzzzz: %v", err)
	}
}
