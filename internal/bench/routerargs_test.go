package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
)

func TestNamedPolicyEntriesKeepTheirNamesAndModes(t *testing.T) {
	ps, err := ParsePolicies([]string{"engine=cache_aware:none, cache_aware", "rr=round_robin"}, SessionBody)
	if err != nil {
		t.Fatal(err)
	}
	want := []PolicySpec{{Name: "engine", Policy: "cache_aware", SessionMode: SessionNone},
		{Name: "cache_aware", Policy: "cache_aware", SessionMode: SessionBody},
		{Name: "rr", Policy: "round_robin", SessionMode: SessionBody}}
	if len(ps) != len(want) {
		t.Fatalf("%+v", ps)
	}
	for i := range want {
		if ps[i].Name != want[i].Name || ps[i].Policy != want[i].Policy || ps[i].SessionMode != want[i].SessionMode {
			t.Fatalf("entry %d: %+v, want %+v", i, ps[i], want[i])
		}
	}
}

func TestPolicyEntriesWithBadOrRepeatedNamesAreRefused(t *testing.T) {
	for _, bad := range []string{
		"a=round_robin,a=cache_aware", // the same name twice
		"cache_aware,cache_aware=round_robin",
		"=cache_aware", "-x=cache_aware", "my entry=cache_aware",
		"x=nope", "x=cache_aware:sometimes",
	} {
		if _, err := ParsePolicies([]string{bad}, SessionHeader); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRouterArgGoesToEveryEntryOrToTheNamedOne(t *testing.T) {
	ps, err := ParsePolicies([]string{"a=cache_aware,b=cache_aware:none"}, SessionHeader)
	if err != nil {
		t.Fatal(err)
	}
	err = ApplyRouterArgs(ps, []string{"--load-signal=tokens", "b=--balance-abs-threshold=0", "b=--disable-circuit-breaker"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ps[0].Args, " ") != "--load-signal=tokens" ||
		strings.Join(ps[1].Args, " ") != "--load-signal=tokens --balance-abs-threshold=0 --disable-circuit-breaker" {
		t.Fatalf("args a %q, b %q", ps[0].Args, ps[1].Args)
	}
	a, err := routerConfig(ps[0], []string{"http://127.0.0.1:1"}, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := routerConfig(ps[1], []string{"http://127.0.0.1:1"}, "redis://127.0.0.1:6379", 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.LoadSignal != "tokens" || cacheaware.KnobsIn(a.PolicyOptions).BalanceAbsThreshold != 64 || a.DisableCircuitBreaker || a.SessionStore != "memory" {
		t.Fatalf("a: %+v", a)
	}
	ps[0].Args = append(ps[0].Args, "--session-store=memory")
	if a, err = routerConfig(ps[0], []string{"http://127.0.0.1:1"}, "redis://127.0.0.1:6379", 1); err != nil || a.SessionStore != "memory" || a.RedisURL != "" {
		t.Fatalf("--session-store=memory with a shared store: %v, store %s %s", err, a.SessionStore, a.RedisURL)
	}
	if b.LoadSignal != "tokens" || cacheaware.KnobsIn(b.PolicyOptions).BalanceAbsThreshold != 0 || !b.DisableCircuitBreaker ||
		b.SessionStore != "redis" || b.RedisURL != "redis://127.0.0.1:6379" || b.Policy != "cache_aware" || b.PrometheusPort != 0 {
		t.Fatalf("b: %+v", b)
	}
}

func TestBadRouterArgsAreRefusedNamingTheEntryAndTheFlag(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"nobody=--load-signal=engine", `no --policies entry named "nobody"`},
		{"--no-such-flag=1", "ca: --router-arg --no-such-flag=1: unknown flag"},
		{"--balance-abs-threshold", "ca: --router-arg --balance-abs-threshold: flag needs an argument"},
		{"--balance-abs-threshold=many", "ca: --router-arg --balance-abs-threshold=many"},
		{"--balance-abs-threshold=-1", "balance-abs-threshold"},
		{"--load-signal=vibes", "entry ca: --load-signal: unknown signal"},
		{"4", "want a router flag"},
		{"ca=4", "want a router flag"},
		{"--port=1", "--port: the bench sets --port itself"},
		{"--worker-urls=http://10.0.0.1:8000", "the bench sets --worker-urls itself"},
		{"ca=--policy=round_robin", "the bench sets --policy itself"},
		{"--session-store=redis", "the bench sets --session-store itself"},
		{"--redis-url=redis://127.0.0.1:6379", "the bench sets --redis-url itself"},
		{"--dns-discovery=workers:8000", "the bench sets --dns-discovery itself"},
		{"--service-discovery", "the bench sets --service-discovery itself"},
	} {
		ps, err := ParsePolicies([]string{"ca=cache_aware"}, SessionHeader)
		if err != nil {
			t.Fatal(err)
		}
		err = ApplyRouterArgs(ps, []string{c.arg})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--router-arg %s: error %v, want it to say %q", c.arg, err, c.want)
		}
	}
}

func TestRouterArgConfigFileIsLoadedUnderTheFlagsGiven(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(good, []byte("balance_abs_threshold: 7\nbalance_rel_threshold: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := PolicySpec{Name: "f", Policy: "cache_aware", SessionMode: SessionHeader,
		Args: []string{"--config=" + good, "--balance-rel-threshold=2"}}
	cfg, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if cacheaware.KnobsIn(cfg.PolicyOptions).BalanceAbsThreshold != 7 || cacheaware.KnobsIn(cfg.PolicyOptions).BalanceRelThreshold != 2 || cfg.LogLevel != "error" || cfg.ShutdownGraceSecs != 5 || cfg.PrometheusPort != 0 {
		t.Fatalf("config %+v", cfg)
	}
	owned := filepath.Join(dir, "owned.yaml")
	if err := os.WriteFile(owned, []byte("worker_urls: [http://10.0.0.1:8000]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.Args = []string{"--config=" + owned}
	if _, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "", 1); err == nil || !strings.Contains(err.Error(), "worker_urls") {
		t.Fatalf("a file setting worker_urls: %v", err)
	}
}

// An in-process router scrapes its workers' /metrics at their time scale, so its load figures
// are as stale, relative to its requests, as a router's at the default period in a real fleet;
// a --worker-metrics-interval router arg, on the command line or in a file, still decides.
func TestInProcessRoutersScrapeAtTheWorkersTimeScale(t *testing.T) {
	p := PolicySpec{Name: "s", Policy: "cache_aware", SessionMode: SessionHeader}
	for _, c := range []struct {
		scale float64
		want  time.Duration
	}{{1, 100 * time.Millisecond}, {0.5, 50 * time.Millisecond}, {0.1, 10 * time.Millisecond}, {0.01, 10 * time.Millisecond}, {0, 100 * time.Millisecond}} {
		cfg, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "", c.scale)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.WorkerMetricsInterval != c.want {
			t.Errorf("time scale %v: scrape every %v, want %v", c.scale, cfg.WorkerMetricsInterval, c.want)
		}
	}
	file := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(file, []byte("worker_metrics_interval: 40ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{"--worker-metrics-interval=40ms", "--config=" + file} {
		p.Args = []string{arg}
		cfg, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "", 0.1)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.WorkerMetricsInterval != 40*time.Millisecond {
			t.Errorf("%s at time scale 0.1: scrape every %v, want 40ms", arg, cfg.WorkerMetricsInterval)
		}
	}
}

// Scraped loads are sampled every 100 ms of full-scale time, so a window of samples covers the
// same simulated time as an in-process router's, whatever --target-time-scale is.
func TestScrapedSamplingIntervalFollowsTheTimeScale(t *testing.T) {
	for _, c := range []struct {
		scale float64
		want  time.Duration
	}{{1, 100 * time.Millisecond}, {0.5, 50 * time.Millisecond}, {0.1, 10 * time.Millisecond}, {0.01, 10 * time.Millisecond}, {0, 100 * time.Millisecond}} {
		if got := scrapedInterval(c.scale); got != c.want {
			t.Errorf("time scale %g: %v, want %v", c.scale, got, c.want)
		}
	}
}

func TestPredictedHitRateWeighsEachMatchByItsPromptTokens(t *testing.T) {
	recs := []Record{
		{PromptTokens: 100, CachedTokens: 50, PrefixMatch: 0.5, HasPrefixMatch: true},
		{PromptTokens: 300, CachedTokens: 300, PrefixMatch: 0.9, HasPrefixMatch: true},
		{PromptTokens: 600, CachedTokens: 0},                                          // no header: left out
		{PromptTokens: 100, PrefixMatch: 1, HasPrefixMatch: true, Err: "HTTP 500: x"}, // failed: left out
	}
	r := summarize(&Target{Name: "t"}, runResult{records: recs}, 1)
	if r.PredictedHitRate == nil || *r.PredictedHitRate < 0.7999 || *r.PredictedHitRate > 0.8001 {
		t.Fatalf("predicted %v, want (50+270)/400 = 0.8", r.PredictedHitRate)
	}
	none := summarize(&Target{Name: "t"}, runResult{records: recs[2:3]}, 1)
	if none.PredictedHitRate != nil || tableRow(&none)[2] != "n/a" {
		t.Fatalf("without the header: %v, cell %q", none.PredictedHitRate, tableRow(&none)[2])
	}
	for v, want := range map[string]bool{"0.2500": true, "1": true, "": false, "1.5": false, "-0.1": false, "NaN": false, "x": false} {
		if _, ok := prefixMatch(v); ok != want {
			t.Errorf("prefix match %q accepted %v", v, ok)
		}
	}
}
