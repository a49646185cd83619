package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/haproxyproc"
	"github.com/cacheroute/cacheroute/internal/metrics"
)

// RouterChildEnv, set in the environment, makes the test binary run the cacheroute command line
// (main_test.go): the --fronts tests start their router fronts from os.Args[0].
const RouterChildEnv = "CACHEROUTE_BENCH_TEST_AS_ROUTER"

func TestParseFronts_ReadsNamesModesAndEvents(t *testing.T) {
	fs, err := ParseFronts([]string{"direct,haproxy:none", "ev=cache_aware:none+events,nginx"}, SessionHeader)
	if err != nil {
		t.Fatal(err)
	}
	want := []FrontSpec{{Name: "direct", Front: FrontDirect, SessionMode: SessionHeader},
		{Name: "haproxy:none", Front: HAProxyPolicy, SessionMode: SessionNone},
		{Name: "ev", Front: "cache_aware", SessionMode: SessionNone, Events: true},
		{Name: "nginx", Front: FrontNginx, SessionMode: SessionHeader}}
	if len(fs) != len(want) {
		t.Fatalf("%+v", fs)
	}
	for i := range want {
		if fs[i].Name != want[i].Name || fs[i].Front != want[i].Front || fs[i].SessionMode != want[i].SessionMode || fs[i].Events != want[i].Events {
			t.Fatalf("entry %d: %+v, want %+v", i, fs[i], want[i])
		}
	}
}

func TestParseFronts_RefusesWhatCannotRun(t *testing.T) {
	for list, want := range map[string]string{
		"cache_aware":                   "give direct exactly once",
		"direct,direct2=direct":         "give direct exactly once",
		"direct,haproxy+events":         "is for routers",
		"direct,haproxy:body":           "x-session-id header",
		"direct,squid":                  "unknown front",
		"direct,a=cache_aware,a=nginx":  "given twice",
		"direct,cache_aware:sometimes":  "session id mode",
		"direct,-x=cache_aware:none":    "NAME that neither",
		"direct,nginx:header+events":    "is for routers",
		"direct,round_robin:none+event": "session id mode",
	} {
		if _, err := ParseFronts([]string{list}, SessionHeader); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", list, err, want)
		}
	}
}

func TestFrontRouterArgsGoToRouterFrontsOnly(t *testing.T) {
	fs, err := ParseFronts([]string{"direct,ids=cache_aware,none=cache_aware:none"}, SessionHeader)
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyFrontRouterArgs(fs, []string{"--cache-threshold=0.4", "none=--load-signal=requests"}); err != nil {
		t.Fatal(err)
	}
	if len(fs[0].Args) != 0 || !slices.Equal(fs[1].Args, []string{"--cache-threshold=0.4"}) ||
		!slices.Equal(fs[2].Args, []string{"--cache-threshold=0.4", "--load-signal=requests"}) {
		t.Fatalf("args %q, %q, %q", fs[0].Args, fs[1].Args, fs[2].Args)
	}
	if err := ApplyFrontRouterArgs(fs, []string{"direct=--cache-threshold=0.4"}); err == nil || !strings.Contains(err.Error(), "runs no router") {
		t.Fatalf("a router arg for direct: %v", err)
	}
	if err := ApplyFrontRouterArgs(fs, []string{"ids=--policy=round_robin"}); err == nil || !strings.Contains(err.Error(), "--fronts") {
		t.Fatalf("a flag the bench owns: %v", err)
	}
}

// Each front's times are paired with the same request's direct: request i through the front less
// request i direct, whatever order the answers came in; failed requests on either side are left
// out.
func TestPairedDeltasMatchRequestsBySessionAndTurn(t *testing.T) {
	ms := time.Millisecond
	direct := []Record{{Session: 0, Turn: 0, TTFT: 10 * ms, E2E: 20 * ms}, {Session: 0, Turn: 1, TTFT: 30 * ms, E2E: 40 * ms},
		{Session: 1, Turn: 0, TTFT: 5 * ms, E2E: 6 * ms, Err: "boom"}}
	front := []Record{{Session: 0, Turn: 1, TTFT: 33 * ms, E2E: 41 * ms}, {Session: 0, Turn: 0, TTFT: 11 * ms, E2E: 25 * ms},
		{Session: 1, Turn: 0, TTFT: 50 * ms, E2E: 60 * ms}}
	ttft, e2e := pairedDeltas(direct, front)
	if !slices.Equal(ttft, []float64{3, 1}) || !slices.Equal(e2e, []float64{1, 5}) {
		t.Fatalf("ttft %v, e2e %v", ttft, e2e)
	}
	l := latencyOf(ttft)
	if l == nil || l.P50 != 2 || latencyOf(nil) != nil {
		t.Fatalf("latency %+v", l)
	}
}

func TestSumByLabelAddsTheSamplesOfEachLabelValue(t *testing.T) {
	text := `# HELP vllm_router_tokenize_requests_total x
vllm_router_tokenize_requests_total{result="ok"} 7
vllm_router_tokenize_requests_total{result="timeout",model="m"} 2
vllm_router_tokenize_requests_total{model="m",result="timeout"} 1
vllm_router_tokenize_requests_total_other{result="ok"} 100
vllm_router_other{result="ok"} 100
`
	got, err := sumByLabel(strings.NewReader(text), metricTokenize, "result")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["ok"] != 7 || got["timeout"] != 3 {
		t.Fatalf("%v", got)
	}
}

func TestSelectRequestsKeepsTheSizesAskedAndCapsOutputs(t *testing.T) {
	w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	sizes := func(w *Workload) (out []int) {
		for _, s := range w.Sessions {
			for _, t := range s.Turns {
				out = append(out, messagesJSONBytes(t.Append))
			}
		}
		return out
	}
	all := sizes(&w)
	lo, hi := slices.Min(all)+1, slices.Max(all)-1
	sel := w
	if err := sel.SelectRequests(lo, hi, 0); err != nil {
		t.Fatal(err)
	}
	kept := sizes(&sel)
	if len(kept) == 0 || len(kept) >= len(all) || sel.ReuseCeiling != nil {
		t.Fatalf("kept %v of %v, ceiling %v", kept, all, sel.ReuseCeiling)
	}
	for _, b := range kept {
		if b < lo || b > hi {
			t.Fatalf("kept a request of %d bytes outside %d-%d", b, lo, hi)
		}
	}
	limited := w
	if err := limited.SelectRequests(0, 0, 2); err != nil || limited.Requests() != 2 {
		t.Fatalf("limit 2: %d requests, %v", limited.Requests(), err)
	}
	if err := limited.SelectRequests(1<<30, 0, 0); err == nil {
		t.Fatal("nothing that large, yet no error")
	}
	agent := replayAgent(t, 1)
	if err := agent.SelectRequests(1, 0, 0); err == nil || !strings.Contains(err.Error(), "stand alone") {
		t.Fatalf("selecting turns of a conversation: %v", err)
	}
	w.CapOutputTokens(5)
	for _, s := range w.Sessions {
		for _, t2 := range s.Turns {
			if t2.MaxTokens > 5 {
				t.Fatalf("max_tokens %d above the cap", t2.MaxTokens)
			}
		}
	}
}

// The /proc figures of a process that works: this one, spinning, has used CPU by both counts.
func TestReadCPUOfABusyProcessGrows(t *testing.T) {
	before, err := readCPU(os.Getpid())
	if err != nil {
		t.Skip("no /proc here:", err)
	}
	x := 0
	for i := range 50_000_000 {
		x += i % 7
	}
	after, err := readCPU(os.Getpid())
	if err != nil || x == 0 {
		t.Fatal(err)
	}
	if !before.hasSched || !(after.schedstat > before.schedstat) || after.stat < before.stat {
		t.Fatalf("before %+v, after %+v", before, after)
	}
}

// The fronts take turns on rounds of whole sessions of at least the size asked, in workload order.
func TestSplitRoundsCutsWholeSessionsInOrder(t *testing.T) {
	w := Workload{Name: "w"}
	for i, turns := range []int{3, 1, 1, 4, 2} {
		w.Sessions = append(w.Sessions, Session{ID: fmt.Sprint(i), Turns: make([]Turn, turns)})
	}
	var got []string
	for _, r := range splitRounds(&w, 2) {
		got = append(got, fmt.Sprintf("%d:%d", r.firstSession, r.w.Requests()))
	}
	if want := []string{"0:3", "1:2", "3:4", "4:2"}; !slices.Equal(got, want) {
		t.Fatalf("rounds (first session:requests) %v, want %v", got, want)
	}
	if all := splitRounds(&w, 0); len(all) != 1 || all[0].w.Requests() != w.Requests() {
		t.Fatalf("size 0: %d rounds", len(all))
	}
}

// The --fronts run end to end on loopback: a short trace replay, in rounds, straight to one
// simulated worker and through every front there is here (routers as processes of this test
// binary; HAProxy and nginx when installed). Every front answers every request, each is paired
// with direct, its processes' CPU is read, and no router asks /tokenize, not even the one
// subscribed to the worker's events: one worker takes every request whatever it holds.
func TestFrontsReportEveryFrontPairedWithDirect(t *testing.T) {
	t.Setenv(RouterChildEnv, "1")
	list := "direct,cache_aware,none=cache_aware:none,events=cache_aware:none+events"
	if _, err := haproxyproc.Start(haproxyproc.Config{}); !errors.Is(err, haproxyproc.ErrNotInstalled) {
		list += ",haproxy,haproxy:none"
	}
	if _, err := exec.LookPath("nginx"); err == nil {
		list += ",nginx"
	}
	fs, err := ParseFronts([]string{list}, SessionHeader)
	if err != nil {
		t.Fatal(err)
	}
	w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	w.CapOutputTokens(4)
	simCfg := scaledSim(0.1)
	simCfg.BlockSize = 16
	rep := mustRun(t, Options{Workload: w, Fronts: fs, RouterCommand: []string{os.Args[0]}, Sim: simCfg,
		Concurrency: 1, Timeout: 30 * time.Second, FrontIdle: 100 * time.Millisecond, FrontRound: 2})
	if len(rep.Fronts) != len(fs) || len(rep.Targets) != len(fs) || rep.PromptBytes == nil || !(rep.PromptBytes.Max > 0) {
		t.Fatalf("%d fronts, %d targets, prompt bytes %+v, want %d", len(rep.Fronts), len(rep.Targets), rep.PromptBytes, len(fs))
	}
	n := w.Requests()
	for i, f := range rep.Fronts {
		if f.Name != fs[i].Name || f.Requests != n || f.Errors != 0 || f.Paired != n || rep.Targets[i].Requests != n {
			t.Fatalf("%s: %d answered, %d failed, %d paired, want %d (errors %v)", f.Name, f.Requests, f.Errors, f.Paired, n, rep.Targets[i].ErrorSamples)
		}
		if f.Front == FrontDirect {
			if f.AddedTTFT != nil || f.CPUPerRequestUS != nil {
				t.Fatalf("direct has figures against itself: %+v", f)
			}
			continue
		}
		if f.AddedTTFT == nil || f.AddedE2E == nil || f.CPUPerRequestUS == nil || !(*f.CPUPerRequestUS > 0) ||
			f.StatCPUPerRequestUS == nil || *f.StatCPUPerRequestUS < 0 || f.IdleCPUPerSecUS == nil || *f.IdleCPUPerSecUS < 0 {
			t.Fatalf("%s: added %+v %+v, CPU per request %v (stat %v, idle %v)", f.Name, f.AddedTTFT, f.AddedE2E, f.CPUPerRequestUS, f.StatCPUPerRequestUS, f.IdleCPUPerSecUS)
		}
		asked := 0.0
		for _, r := range metrics.TokenizeResults {
			asked += f.Tokenize[r]
		}
		switch {
		case fs[i].router() && f.Tokenize == nil:
			t.Fatalf("%s: the router's /tokenize calls were not read", f.Name)
		case !fs[i].router() && f.Tokenize != nil:
			t.Fatalf("%s: tokenize counts %v for a front that is no router", f.Name, f.Tokenize)
		case asked != 0:
			// With events too: the one worker takes every request whatever its engine holds, so
			// no request is worth its tokens.
			t.Fatalf("%s: /tokenize called %v in front of one worker", f.Name, f.Tokenize)
		}
	}
	var out bytes.Buffer
	if err := WriteTable(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if !strings.Contains(out.String(), "\n"+f.Name+" ") {
			t.Fatalf("the table has no row for %s:\n%s", f.Name, out.String())
		}
	}
}
