package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// loadVLLMRouter parses a vLLM router command line as the root command does: its flags, the
// ignored ones beside them, every list flag's space-separated form. It returns the flagged and
// the resolved configuration, and the flag set.
func loadVLLMRouter(t *testing.T, args ...string) (flagged, final config.Config, fs *pflag.FlagSet) {
	t.Helper()
	flagged = config.Default()
	fs = pflag.NewFlagSet("cacheroute", pflag.ContinueOnError)
	config.BindFlags(fs, &flagged)
	config.BindVLLMRouterFlags(fs)
	for _, name := range config.SpaceSeparatedFlags() {
		args = config.ExpandSpaceSeparated(args, name)
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	if len(fs.Args()) != 0 {
		t.Fatalf("%q left arguments %q", args, fs.Args())
	}
	final, err := config.Load(fs, &flagged, "")
	if err != nil {
		t.Fatalf("Load %q: %v", args, err)
	}
	return flagged, final, fs
}

// The vLLM router's `--prefill URL [PORT|none]`: the port or none after a URL is that URL's
// bootstrap port, not a URL; a port is reported (it is not used), none is not.
func TestPrefillTakesTheVLLMRoutersBootstrapPortOrNone(t *testing.T) {
	flagged, c, fs := loadVLLMRouter(t, "--vllm-pd-disaggregation",
		"--prefill", "http://127.0.0.1:8001", "9000",
		"--prefill", "http://127.0.0.1:8002", "none",
		"--prefill", "http://127.0.0.1:8003", "NONE",
		"--decode", "http://127.0.0.1:8004")
	if want := []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"}; !slices.Equal(c.Prefill, want) {
		t.Fatalf("prefill workers %q, want %q", c.Prefill, want)
	}
	ignored := config.IgnoredFlags(fs, flagged)
	if len(ignored) != 1 || ignored[0].Flag != "--prefill" || ignored[0].Value != "http://127.0.0.1:8001 9000" || !strings.Contains(ignored[0].Instead, "NIXL") {
		t.Fatalf("reported %+v, want the one bootstrap port given", ignored)
	}
	fs = pflag.NewFlagSet("x", pflag.ContinueOnError)
	cfg := config.Default()
	config.BindFlags(fs, &cfg)
	if err := fs.Parse([]string{"--prefill", "9000"}); err == nil || !strings.Contains(err.Error(), "follows no URL") {
		t.Fatalf("a port with no URL before it: %v", err)
	}
}

// The vLLM router's flags with no counterpart here start a router, each given one reported with
// what cacheroute does instead; those not given are not reported.
func TestVLLMRoutersOtherFlagsAreAcceptedAndReported(t *testing.T) {
	flagged, c, fs := loadVLLMRouter(t, "--worker-urls", "http://127.0.0.1:8000",
		"--worker-startup-check-interval", "1", "--enable-igw", "--request-id-headers", "x-trace-id", "request-id",
		"--log-dir", "/tmp/logs")
	if !slices.Equal(c.WorkerURLs, []string{"http://127.0.0.1:8000"}) {
		t.Fatalf("worker URLs %q", c.WorkerURLs)
	}
	var got []string
	for _, f := range config.IgnoredFlags(fs, flagged) {
		if f.Instead == "" {
			t.Errorf("%s: no word of what is done instead", f.Flag)
		}
		got = append(got, f.Flag+"="+f.Value)
	}
	want := []string{"--worker-startup-check-interval=1", "--enable-igw=true", "--log-dir=/tmp/logs", "--request-id-headers=x-trace-id,request-id"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("reported %q, want %q", got, want)
	}
	if help := fs.FlagUsages(); strings.Contains(help, "worker-startup-check-interval") {
		t.Error("the ignored flags are in the help")
	}
}

// The vLLM router's flags that do something here do the same: its spellings of cacheroute's
// flags, --disable-retries, the per-role data-parallel sizes and the Python launcher's log levels.
func TestVLLMRoutersSpellingsMeanWhatTheyMeanThere(t *testing.T) {
	flagged, c, fs := loadVLLMRouter(t, "--worker-urls", "http://127.0.0.1:8000",
		"--eviction-interval", "7", "--otel-sampling-ratio", "0.25", "--disable-retries", "--retry-max-retries", "5",
		"--prefill-data-parallel-size", "4", "--decode-data-parallel-size", "2", "--log-level", "warning",
		"--cors-allowed-origins", "https://a.example", "https://b.example")
	if v := fs.Lookup("eviction-interval-secs").Value.String(); v != "7" {
		t.Errorf("--eviction-interval 7 set --eviction-interval-secs to %s", v)
	}
	if c.TraceSampleRatio != 0.25 || c.RetryMaxRetries != 0 || c.LogLevel != "warn" {
		t.Errorf("sample ratio %v, retries %d, log level %q", c.TraceSampleRatio, c.RetryMaxRetries, c.LogLevel)
	}
	if got := c.RoleDPSize(); got[workers.RolePrefill] != 4 || got[workers.RoleDecode] != 2 || len(got) != 2 {
		t.Errorf("RoleDPSize() = %v", got)
	}
	if !slices.Equal(c.CORSAllowedOrigins, []string{"https://a.example", "https://b.example"}) {
		t.Errorf("CORS origins %q", c.CORSAllowedOrigins)
	}
	if ignored := config.IgnoredFlags(fs, flagged); len(ignored) != 0 {
		t.Errorf("flags that do something here reported as ignored: %+v", ignored)
	}
	for _, l := range []string{"critical", "CRITICAL"} {
		if _, c, _ := loadVLLMRouter(t, "--worker-urls", "http://127.0.0.1:8000", "--log-level", l); c.LogLevel != "error" {
			t.Errorf("--log-level %s is %q, want error", l, c.LogLevel)
		}
	}
}

// The vLLM router's OTLP endpoints are OTLP/gRPC, host:port or a URL on 4317, which cacheroute
// does not export: the start stops with the OTLP/HTTP form to give, rather than sending spans
// to a gRPC listener.
func TestVLLMRoutersOTLPEndpointsStopTheStartWithTheOTLPHTTPURL(t *testing.T) {
	for ep, want := range map[string]string{
		"127.0.0.1:4317":        "http://127.0.0.1:4318",
		"localhost:4317":        "http://localhost:4318",
		"http://127.0.0.1:4317": "port (4318",
	} {
		flagged := config.Default()
		fs := pflag.NewFlagSet("cacheroute", pflag.ContinueOnError)
		config.BindFlags(fs, &flagged)
		config.BindVLLMRouterFlags(fs)
		if err := fs.Parse([]string{"--worker-urls", "http://127.0.0.1:8000", "--otlp-traces-endpoint", ep}); err != nil {
			t.Fatal(err)
		}
		_, err := config.Load(fs, &flagged, "")
		if err == nil || !strings.Contains(err.Error(), "--otlp-traces-endpoint:") || !strings.Contains(err.Error(), want) {
			t.Errorf("--otlp-traces-endpoint %s: %v; want an error naming the flag and %q", ep, err, want)
		}
	}
}
