package config

import (
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// vllmrouter.go takes the vLLM router's command lines as they are written (its Rust binary's and
// its Python launcher's, docs/migrating-from-vllm-router.md lists them all): its spellings of
// cacheroute's own flags and values, and its flags that have no counterpart here, which are
// accepted, each with one warning at start that says what cacheroute does instead.

// flagSpellings are the vLLM router's names of flags cacheroute spells otherwise.
var flagSpellings = map[string]string{
	"eviction-interval":   "eviction-interval-secs", // the Rust binary's; the Python launcher's is cacheroute's
	"otel-sampling-ratio": "trace-sample-ratio",
}

// vllmRouterSpelling is the flag sets' normalisation: a vLLM router spelling names the flag.
func vllmRouterSpelling(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	if to, ok := flagSpellings[name]; ok {
		return pflag.NormalizedName(to)
	}
	return pflag.NormalizedName(name)
}

// logLevelSpellings are the Python launcher's log levels that cacheroute names otherwise.
var logLevelSpellings = map[string]string{"warning": "warn", "critical": "error"}

// takeVLLMRouterValues rewrites the values the vLLM router gives in forms of its own into
// cacheroute's: --disable-retries and the Python launcher's log levels. (Its OTLP endpoint
// written host:port is OTLP/gRPC, which is not exported: Validate refuses it with the OTLP/HTTP
// URL to give.)
func (c *Config) takeVLLMRouterValues() {
	if c.DisableRetries {
		c.RetryMaxRetries = 0
	}
	if to, ok := logLevelSpellings[strings.ToLower(c.LogLevel)]; ok {
		c.LogLevel = to
	}
}

// RoleDPSize is the data-parallel ranks per URL of the roles whose size is their own.
func (c Config) RoleDPSize() map[workers.Role]int {
	out := map[workers.Role]int{}
	if c.PrefillDPSize > 0 {
		out[workers.RolePrefill] = c.PrefillDPSize
	}
	if c.DecodeDPSize > 0 {
		out[workers.RoleDecode] = c.DecodeDPSize
	}
	return out
}

// flagForm is how an ignored flag takes its value.
type flagForm uint8

const (
	noValue  flagForm = iota // --enable-igw
	oneValue                 // --log-dir DIR
	values                   // --request-id-headers A B, or the flag repeated
)

// ignoredFlag is a flag of the vLLM router's command line with no counterpart here.
type ignoredFlag struct {
	name    string
	form    flagForm
	instead string // what cacheroute does instead
}

// ignoredFlags are the vLLM router's flags cacheroute accepts and does not act on.
var ignoredFlags = []ignoredFlag{
	{"worker-startup-timeout-secs", oneValue, "the router does not wait for workers at start: each is probed at once, and one that does not answer joins when a health check passes"},
	{"worker-startup-check-interval", oneValue, "workers are probed every --health-check-interval-secs (sooner while they have not come up), and power_of_two balances on --load-signal, refreshed every --worker-metrics-interval"},
	{"backend", oneValue, "workers are OpenAI-compatible HTTP servers (vLLM, SGLang, ...); the Anthropic Messages API is a route, /v1/messages"},
	{"runtime", oneValue, "workers are OpenAI-compatible HTTP servers (vLLM, SGLang, ...); the Anthropic Messages API is a route, /v1/messages"},
	{"mini-lb", noValue, "there is one router, this one"},
	{"enable-igw", noValue, "one router serves every model its workers list, each request going to the workers of its model"},
	{"history-backend", oneValue, "stored responses stay on the workers that made them; the router keeps only which worker holds each"},
	{"profile", noValue, "the router makes no profiling calls to workers"},
	{"model-path", oneValue, "prompt tokens come from the workers' own /tokenize (--tokenize-url names a render service instead)"},
	{"tokenizer-path", oneValue, "prompt tokens come from the workers' own /tokenize (--tokenize-url names a render service instead)"},
	{"pd-disaggregation", noValue, "prefill/decode disaggregation speaks vLLM's NIXL transfer: --vllm-pd-disaggregation"},
	{"vllm-discovery-address", oneValue, "prefill and decode workers come from --prefill and --decode, --service-discovery with --prefill-selector and --decode-selector, or the admin API"},
	{"enable-program-scheduling", noValue, "requests are admitted one by one: --max-concurrent-requests, --priority-levels and the tenant rate limits"},
	{"program-scheduling-config-json", oneValue, "requests are admitted one by one: --max-concurrent-requests, --priority-levels and the tenant rate limits"},
	{"rate-limit-tokens-per-second", oneValue, "rates are per tenant: --tenant-requests-per-minute and --tenant-tokens-per-minute"},
	{"retry-backoff-multiplier", oneValue, "the backoff doubles after each retry, up to --retry-max-backoff-ms"},
	{"retry-jitter-factor", oneValue, "each backoff is drawn between half and all of its length"},
	{"cb-success-threshold", oneValue, "one successful trial request closes a worker's breaker"},
	{"cb-window-duration-secs", oneValue, "failures open a breaker when they come in a row (--cb-failure-threshold), over no window"},
	{"log-dir", oneValue, "logs go to standard error, as text or JSON (--log-format)"},
	{"request-id-headers", values, "the request id is read from x-request-id only; other id headers reach the worker untouched"},
	{"enable-trace", noValue, "requests are traced whenever --otlp-traces-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT names a collector"},
	{"otel-excluded-paths", values, "only routed requests are traced; health, readiness and admin paths never are"},
	{"api-key-validation-urls", values, "client keys come from a file, --client-api-keys-file"},
	{"wasm-middleware", oneValue, "no request middleware is run"},
	{"wasm-middleware-sha256", oneValue, "no request middleware is run"},
	{"wasm-middleware-route", values, "no request middleware is run"},
}

// BindVLLMRouterFlags registers the vLLM router's flags that have no counterpart here, hidden
// from the help, so that its command lines start a router; IgnoredFlags reports those given.
// They have no YAML key: the vLLM router reads no file.
func BindVLLMRouterFlags(fs *pflag.FlagSet) {
	for _, f := range ignoredFlags {
		usage := "accepted for the vLLM router's command lines, with no effect: " + f.instead
		switch f.form {
		case noValue:
			fs.Bool(f.name, false, usage)
		case oneValue:
			fs.String(f.name, "", usage)
		case values:
			fs.StringArray(f.name, nil, usage)
		}
		_ = fs.MarkHidden(f.name)
	}
}

// SpaceSeparatedFlags take their values as separate arguments after the flag, as the vLLM
// router's do (`--worker-urls a b`), besides the comma-separated and repeated forms; the command
// line is rewritten with ExpandSpaceSeparated for each before it is parsed.
func SpaceSeparatedFlags() []string {
	out := []string{"worker-urls", "prefill", "decode", "selector", "prefill-selector", "decode-selector", "cors-allowed-origins"}
	for _, f := range ignoredFlags {
		if f.form == values {
			out = append(out, f.name)
		}
	}
	return out
}

// Ignored is a flag of the vLLM router's command line that was given and that the router does
// not act on, with what it does instead: one warning at start each.
type Ignored struct {
	Flag, Value, Instead string
}

// IgnoredFlags lists the ignored flags given in fs, in the order of the vLLM router's
// reference, then the bootstrap ports given after --prefill URLs in flagged.
func IgnoredFlags(fs *pflag.FlagSet, flagged Config) []Ignored {
	var out []Ignored
	for _, f := range ignoredFlags {
		if !fs.Changed(f.name) {
			continue
		}
		v := fs.Lookup(f.name).Value.String()
		if f.form == values {
			v = strings.Trim(v, "[]")
		}
		out = append(out, Ignored{Flag: "--" + f.name, Value: v, Instead: f.instead})
	}
	for _, p := range flagged.PrefillBootstrapPorts {
		out = append(out, Ignored{Flag: "--prefill", Value: tenant.Redact(p.URL) + " " + p.Port,
			Instead: "the bootstrap port is not used: vLLM's NIXL transfer, the one the router speaks, needs none"})
	}
	return out
}

// IsIgnoredFlag reports whether name is one of the vLLM router's flags that the router accepts
// and does not act on.
func IsIgnoredFlag(name string) bool {
	return slices.ContainsFunc(ignoredFlags, func(f ignoredFlag) bool { return f.name == name })
}
