package config_test

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
)

// load parses args the way the root command does (space-separated --worker-urls expanded, a
// --config flag beside the knobs) and returns the resolved configuration and the positional
// arguments left over.
func load(t *testing.T, args ...string) (config.Config, []string, error) {
	t.Helper()
	cfg := config.Default()
	var file string
	fs := pflag.NewFlagSet("cacheroute", pflag.ContinueOnError)
	config.BindFlags(fs, &cfg)
	fs.StringVar(&file, "config", "", "YAML file")
	if err := fs.Parse(config.ExpandSpaceSeparated(args, "worker-urls", "sim", "bench", "demo")); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	final, err := config.Load(fs, &cfg, file)
	return final, fs.Args(), err
}

// wantErrorNaming fails the test with ifNil when err is nil, and otherwise for each of wants that
// its text does not contain: the check of every refusal that must name all it is about (flags,
// URLs, the way out).
func wantErrorNaming(t *testing.T, err error, ifNil string, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatal(ifNil)
	}
	for _, want := range wants {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func mustLoad(t *testing.T, args ...string) config.Config {
	t.Helper()
	c, rest, err := load(t, args...)
	if err != nil {
		t.Fatalf("Load %q: %v", args, err)
	}
	if len(rest) != 0 {
		t.Fatalf("Load %q left arguments %q", args, rest)
	}
	return c
}

func writeYAML(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDefaultsMatchTheDocumentedTable reads the flag table of docs/configuration.md and compares
// every default it states with the flag's own, and every flag with the table: a flag left out of
// the table, or a default changed on one side only, fails.
func TestDefaultsMatchTheDocumentedTable(t *testing.T) {
	t.Setenv(config.SessionHashSaltEnv, "")
	t.Setenv(config.APIKeyEnv, "")
	t.Setenv(config.AdminAPIKeyEnv, "")
	t.Setenv(config.RedisURLEnv, "")
	cfg := config.Default()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	config.BindFlags(fs, &cfg)
	documented := documentedDefaults(t, filepath.Join("..", "..", "docs", "configuration.md"))
	for name, doc := range documented {
		f := fs.Lookup(name)
		if f == nil {
			if name != "config" && name != "version" { // the command's own flags, not knobs
				t.Errorf("docs/configuration.md documents --%s, which is no flag", name)
			}
			continue
		}
		if got := flagDefault(t, f); got != normalDefault(t, f, doc) {
			t.Errorf("--%s: the flag's default is %q, docs/configuration.md says %q", name, got, doc)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := documented[f.Name]; !ok {
			t.Errorf("--%s is not in docs/configuration.md's flag table", f.Name)
		}
	})
	want := config.Default()
	if got := mustLoad(t); !reflect.DeepEqual(got, want) {
		t.Errorf("Load with no flags =\n%+v\nwant\n%+v", got, want)
	}
	if err := want.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}

// documentedDefaults reads the first "| flag | default | meaning |" table of the document at
// path: flag name → the default as written ("" for none). A row naming several flags gives
// their defaults in the same order, comma-separated ("`--a`, `--b` | `1`, `2`").
func documentedDefaults(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	inTable := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "| flag | default | meaning |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(out) > 0 {
				break // the table's end
			}
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("%s: a row without its cells: %q", path, line)
		}
		var names []string
		for _, part := range strings.Split(cells[1], ",") {
			name := strings.Trim(strings.TrimSpace(part), "`")
			if strings.HasPrefix(name, "--") {
				names = append(names, strings.TrimPrefix(name, "--"))
			}
		}
		defs := strings.Split(strings.TrimSpace(cells[2]), ", ")
		if len(defs) != len(names) {
			defs = slices.Repeat([]string{strings.TrimSpace(cells[2])}, len(names))
		}
		for i, name := range names {
			out[name] = documentedValue(defs[i])
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no flag table", path)
	}
	return out
}

// documentedValue is a default cell's value: the text in its first backticks, or "" when the
// cell says there is none ("—", "— (off)", "the router's own"); a bare word is taken as it is.
func documentedValue(cell string) string {
	if i := strings.Index(cell, "`"); i >= 0 {
		if j := strings.Index(cell[i+1:], "`"); j >= 0 {
			if v := cell[i+1 : i+1+j]; v != `""` {
				return v
			}
			return ""
		}
	}
	if strings.HasPrefix(cell, "—") || strings.HasPrefix(cell, "the ") {
		return ""
	}
	return strings.Fields(cell)[0]
}

// flagDefault is a flag's default in the table's notation: lists without brackets, durations as
// Go parses them.
func flagDefault(t *testing.T, f *pflag.Flag) string {
	t.Helper()
	return normalDefault(t, f, strings.Trim(f.DefValue, "[]"))
}

// normalDefault writes v, a value of flag f, in one form, so that "1h" and "1h0m0s" compare equal.
func normalDefault(t *testing.T, f *pflag.Flag, v string) string {
	t.Helper()
	if f.Value.Type() == "duration" && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Errorf("--%s: default %q is not a duration", f.Name, v)
		}
		return d.String()
	}
	return v
}

func TestDefaultsAsFlagDefaults(t *testing.T) {
	cfg := config.Default()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	config.BindFlags(fs, &cfg)
	want := map[string]string{
		"host": "127.0.0.1", "port": "30000", "policy": "cache_aware",
		"intra-node-data-parallel-size": "1", "request-timeout-secs": "1800",
		"first-byte-timeout-secs": "60", "max-payload-size": "33554432",
		"client-header-timeout-secs": "10", "client-body-timeout-secs": "60",
		"keepalive-timeout-secs": "75", "max-client-connections": "10000",
		"health-check-interval-secs": "10",
		"health-check-timeout-secs":  "5", "health-check-endpoint": "/health",
		"health-failure-threshold": "3", "health-success-threshold": "2",
		"retry-max-retries": "3", "retry-initial-backoff-ms": "50", "retry-max-backoff-ms": "2000",
		"cb-failure-threshold": "10", "cb-timeout-duration-secs": "30", "disable-circuit-breaker": "false",
		"prometheus-host": "127.0.0.1", "prometheus-port": "29000",
		"log-level": "info", "log-format": "text", "shutdown-grace-secs": "30",
		"cache-threshold": "0.3", "balance-abs-threshold": "64", "balance-rel-threshold": "1.5",
		"max-tree-size": "67108864", "kv-events-index-size": "67108864", "kv-events-endpoint": "", "eviction-interval-secs": "120", "session-ttl": "1h0m0s",
		"max-sessions": "1048576", "worker-urls": "", "api-key": "", "admin-api-key": "",
		"service-discovery": "false", "service-discovery-port": "8000", "dns-refresh-secs": "5",
		"history-match-mode": "cost", "disable-cache-correction": "false", "load-signal": "engine", "worker-metrics-interval": "100ms", "load-unit-tokens": "1024",
	}
	for name, def := range want {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s is not defined", name)
			continue
		}
		if f.DefValue != def {
			t.Errorf("--%s default %q, want %q", name, f.DefValue, def)
		}
	}
}

// Every YAML key is a flag of the same name in kebab case, with help text, and every flag is a
// YAML key: the file and the command line cover the same knobs.
func TestEveryKnobIsBothAFlagAndAYAMLKey(t *testing.T) {
	cfg := config.Default()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	config.BindFlags(fs, &cfg)
	var keys []string
	typ := reflect.TypeFor[config.Config]()
	for i := range typ.NumField() {
		key := typ.Field(i).Tag.Get("yaml")
		if key == "-" {
			continue // the policies' knobs, whose keys are their flags' (below)
		}
		if key == "" {
			t.Errorf("field %s has no yaml key", typ.Field(i).Name)
			continue
		}
		keys = append(keys, key)
		f := fs.Lookup(strings.ReplaceAll(key, "_", "-"))
		if f == nil {
			t.Errorf("yaml key %q has no flag --%s", key, strings.ReplaceAll(key, "_", "-"))
			continue
		}
		if strings.TrimSpace(f.Usage) == "" {
			t.Errorf("--%s has no help text", f.Name)
		}
	}
	// A policy's knobs are YAML keys as their flags: the file sets them through the flag.
	policies := pflag.NewFlagSet("policies", pflag.ContinueOnError)
	for _, o := range cfg.PolicyOptions {
		o.Bind(policies)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(keys, strings.ReplaceAll(f.Name, "-", "_")) && policies.Lookup(f.Name) == nil {
			t.Errorf("flag --%s has no yaml key", f.Name)
		}
	})
}

func TestWorkerURLForms(t *testing.T) {
	a, b, c := "http://127.0.0.1:8000", "http://127.0.0.1:8001", "https://gpu-2.internal:8443/v"
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"space separated", []string{"--worker-urls", a, b, c}, []string{a, b, c}},
		{"space separated then another flag", []string{"--worker-urls", a, b, "--port", "9000"}, []string{a, b}},
		{"comma separated", []string{"--worker-urls", a + "," + b}, []string{a, b}},
		{"comma separated with spaces", []string{"--worker-urls", a + ", " + b + ","}, []string{a, b}},
		{"equals form", []string{"--worker-urls=" + a + "," + c}, []string{a, c}},
		{"repeated flag", []string{"--worker-urls", a, "--port", "9000", "--worker-urls", b}, []string{a, b}},
		{"mixed", []string{"--worker-urls", a + "," + b, "--worker-urls", c}, []string{a, b, c}},
		{"single", []string{"--worker-urls", a}, []string{a}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustLoad(t, tt.args...)
			if !slices.Equal(got.WorkerURLs, tt.want) {
				t.Errorf("WorkerURLs = %q, want %q", got.WorkerURLs, tt.want)
			}
		})
	}
}

func TestSubcommandAfterWorkerURLsIsNotSwallowed(t *testing.T) {
	a, b := "http://127.0.0.1:8000", "http://127.0.0.1:8001"
	tests := []struct {
		name     string
		args     []string
		wantURLs []string
		wantRest []string
	}{
		{"subcommand after urls", []string{"--worker-urls", a, b, "bench"}, []string{a, b}, []string{"bench"}},
		{"subcommand after one url", []string{"--worker-urls", a, "sim", "--port", "1"}, []string{a}, []string{"sim"}},
		{"double dash", []string{"--worker-urls", a, "--", b}, []string{a}, []string{b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, rest, err := load(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.WorkerURLs, tt.wantURLs) || !slices.Equal(rest, tt.wantRest) {
				t.Errorf("urls %q rest %q; want urls %q rest %q", cfg.WorkerURLs, rest, tt.wantURLs, tt.wantRest)
			}
		})
	}
}

func TestExpandSpaceSeparated(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"nothing to do", []string{"--port", "1"}, []string{"--port", "1"}},
		{"three urls", []string{"--worker-urls", "http://a", "http://b", "http://c"},
			[]string{"--worker-urls", "http://a", "--worker-urls", "http://b", "--worker-urls", "http://c"}},
		{"own value taken whatever it looks like", []string{"--worker-urls", "a,b", "http://c"},
			[]string{"--worker-urls", "a,b", "--worker-urls", "http://c"}},
		{"stops at a subcommand name", []string{"--worker-urls", "http://a", "sim", "http://b"},
			[]string{"--worker-urls", "http://a", "sim", "http://b"}},
		{"host:port values are taken, for validation to name the flag", []string{"--worker-urls", "localhost:1", "localhost:2"},
			[]string{"--worker-urls", "localhost:1", "--worker-urls", "localhost:2"}},
		{"stops at a flag", []string{"--worker-urls", "http://a", "--policy", "random"},
			[]string{"--worker-urls", "http://a", "--policy", "random"}},
		{"after double dash untouched", []string{"--", "--worker-urls", "http://a", "http://b"},
			[]string{"--", "--worker-urls", "http://a", "http://b"}},
		{"flag last", []string{"--worker-urls"}, []string{"--worker-urls"}},
		{"other flag with urls untouched", []string{"--host", "http://a", "http://b"}, []string{"--host", "http://a", "http://b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := config.ExpandSpaceSeparated(tt.in, "worker-urls", "sim", "bench"); !slices.Equal(got, tt.want) {
				t.Errorf("ExpandSpaceSeparated(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestConfigFileWithSnakeCaseKeys(t *testing.T) {
	t.Setenv(config.AdminAPIKeyEnv, "")
	path := writeYAML(t, `
host: 0.0.0.0
port: 8080
worker_urls:
  - http://127.0.0.1:8000
  - http://127.0.0.1:8001
policy: consistent_hash
intra_node_data_parallel_size: 4
request_timeout_secs: 60.5
first_byte_timeout_secs: 15
max_payload_size: 1048576
client_header_timeout_secs: 2.5
client_body_timeout_secs: 30
keepalive_timeout_secs: 5
client_write_timeout_secs: 15.5
max_client_connections: 256
health_check_endpoint: /ready
health_failure_threshold: 7
cb_failure_threshold: 4
disable_circuit_breaker: true
prometheus_port: 0
admin_api_key: from-file
log_format: json
session_ttl: 30m
max_sessions: 1000
cache_threshold: 0.5
`)
	got := mustLoad(t, "--config", path)
	want := config.Default()
	want.Host = "0.0.0.0"
	want.Port = 8080
	want.WorkerURLs = []string{"http://127.0.0.1:8000", "http://127.0.0.1:8001"}
	want.Policy = "consistent_hash"
	want.DPSize = 4
	want.RequestTimeoutSecs = 60.5
	want.FirstByteTimeoutSecs = 15
	want.MaxPayloadSize = 1048576
	want.ClientHeaderTimeoutSecs = 2.5
	want.ClientBodyTimeoutSecs = 30
	want.KeepaliveTimeoutSecs = 5
	want.ClientWriteTimeoutSecs = 15.5
	want.MaxClientConnections = 256
	want.HealthCheckEndpoint = "/ready"
	want.HealthFailureThreshold = 7
	want.CBFailureThreshold = 4
	want.DisableCircuitBreaker = true
	want.PrometheusPort = 0
	want.AdminAPIKey = "from-file"
	want.LogFormat = "json"
	want.SessionTTL = 30 * time.Minute
	want.MaxSessions = 1000
	cacheaware.KnobsIn(want.PolicyOptions).CacheThreshold = 0.5
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load(file) =\n%+v\nwant\n%+v", got, want)
	}
}

func TestFlagsOverrideConfigFile(t *testing.T) {
	path := writeYAML(t, `
port: 8080
policy: random
worker_urls: [http://127.0.0.1:8000, http://127.0.0.1:8001]
session_ttl: 30m
health_check_timeout_secs: 2
`)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c config.Config)
	}{
		{"file alone", nil, func(t *testing.T, c config.Config) {
			if c.Port != 8080 || c.Policy != "random" || len(c.WorkerURLs) != 2 || c.SessionTTL != 30*time.Minute {
				t.Errorf("file values not applied: %+v", c)
			}
		}},
		{"port flag wins, the rest from the file", []string{"--port", "9000"}, func(t *testing.T, c config.Config) {
			if c.Port != 9000 || c.Policy != "random" || len(c.WorkerURLs) != 2 {
				t.Errorf("got port %d policy %q urls %q", c.Port, c.Policy, c.WorkerURLs)
			}
		}},
		{"flag equal to the default still wins", []string{"--port", "30000"}, func(t *testing.T, c config.Config) {
			if c.Port != 30000 {
				t.Errorf("port %d, want the flag's 30000", c.Port)
			}
		}},
		{"worker-urls flag replaces the file's list", []string{"--worker-urls", "http://10.0.0.1:1", "http://10.0.0.2:2"}, func(t *testing.T, c config.Config) {
			if want := []string{"http://10.0.0.1:1", "http://10.0.0.2:2"}; !slices.Equal(c.WorkerURLs, want) {
				t.Errorf("urls %q, want %q", c.WorkerURLs, want)
			}
		}},
		{"duration and float flags", []string{"--session-ttl", "90s", "--health-check-timeout-secs", "0.25"}, func(t *testing.T, c config.Config) {
			if c.SessionTTL != 90*time.Second || c.HealthCheckTimeoutSecs != 0.25 {
				t.Errorf("ttl %v timeout %v", c.SessionTTL, c.HealthCheckTimeoutSecs)
			}
		}},
		{"bool flag", []string{"--disable-circuit-breaker"}, func(t *testing.T, c config.Config) {
			if !c.DisableCircuitBreaker {
				t.Error("--disable-circuit-breaker lost")
			}
		}},
		{"flag order does not matter", []string{"--policy", "rendezvous_hash", "--config", path}, func(t *testing.T, c config.Config) {
			if c.Policy != "rendezvous_hash" {
				t.Errorf("policy %q", c.Policy)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if !slices.Contains(args, "--config") {
				args = append([]string{"--config", path}, args...)
			}
			tt.check(t, mustLoad(t, args...))
		})
	}
}

func TestConfigFileErrors(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"unknown key", "port: 8080\nworker_url: http://a:1\n", "worker_url"},
		{"flag spelling is not a key", "worker-urls: [http://a:1]\n", "worker-urls"},
		{"wrong type", "port: eighty\n", "--config"},
		{"invalid value is validated", "policy: fastest\n", "--policy"},
		{"negative threshold in the file", "health_failure_threshold: -1\n", "--health-failure-threshold"},
		{"fractional integer is not truncated", "health_failure_threshold: 2.7\n", "--health-failure-threshold"},
		{"fractional port", "port: 8080.5\n", "--port"},
		{"fractional connection limit", "max_client_connections: 100.5\n", "--max-client-connections"},
		{"first byte timeout past the file's request timeout", "request_timeout_secs: 30\nfirst_byte_timeout_secs: 45\n", "--first-byte-timeout-secs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := load(t, "--config", writeYAML(t, tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, _, err := load(t, "--config", filepath.Join(t.TempDir(), "absent.yaml"))
		if err == nil || !strings.Contains(err.Error(), "--config") {
			t.Errorf("err = %v, want one naming --config", err)
		}
	})
	t.Run("whole numbers written as floats are accepted", func(t *testing.T) {
		c := mustLoad(t, "--config", writeYAML(t, "port: 8080.0\nmax_payload_size: 1e3\nrequest_timeout_secs: 2.5\n"))
		if c.Port != 8080 || c.MaxPayloadSize != 1000 || c.RequestTimeoutSecs != 2.5 {
			t.Errorf("port %d payload %d timeout %v", c.Port, c.MaxPayloadSize, c.RequestTimeoutSecs)
		}
	})
	t.Run("empty file means defaults", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "")
		c := mustLoad(t, "--config", writeYAML(t, "# nothing set\n"))
		if !reflect.DeepEqual(c, config.Default()) {
			t.Errorf("empty file gave %+v", c)
		}
	})
}

// The worker API key and the session hash salt come from the environment, which keeps them out
// of the process list, unless the flag gives them.
func TestSecretsFromEnvironmentUnlessTheFlagGivesThem(t *testing.T) {
	for _, tc := range []struct {
		env, flag string
		get       func(config.Config) string
	}{
		{config.APIKeyEnv, "--api-key", func(c config.Config) string { return c.APIKey }},
		{config.SessionHashSaltEnv, "--session-hash-salt", func(c config.Config) string { return c.SessionHashSalt }},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Setenv(tc.env, "env-value")
			if got := tc.get(mustLoad(t)); got != "env-value" {
				t.Errorf("%q, want the env value", got)
			}
			if got := tc.get(mustLoad(t, tc.flag, "flag-value")); got != "flag-value" {
				t.Errorf("%q, want the flag value over the env", got)
			}
		})
	}
}

func TestAdminAPIKeyFromEnvironment(t *testing.T) {
	t.Run("env used when the flag is absent", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "env-secret")
		if c := mustLoad(t); c.AdminAPIKey != "env-secret" {
			t.Errorf("AdminAPIKey = %q, want the env value", c.AdminAPIKey)
		}
	})
	t.Run("flag wins over env", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "env-secret")
		if c := mustLoad(t, "--admin-api-key", "flag-secret"); c.AdminAPIKey != "flag-secret" {
			t.Errorf("AdminAPIKey = %q, want the flag value", c.AdminAPIKey)
		}
	})
	t.Run("file wins over env", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "env-secret")
		c := mustLoad(t, "--config", writeYAML(t, "admin_api_key: file-secret\n"))
		if c.AdminAPIKey != "file-secret" {
			t.Errorf("AdminAPIKey = %q, want the file value", c.AdminAPIKey)
		}
	})
	t.Run("env used with a file that does not set it", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "env-secret")
		c := mustLoad(t, "--config", writeYAML(t, "port: 1\n"))
		if c.AdminAPIKey != "env-secret" {
			t.Errorf("AdminAPIKey = %q, want the env value", c.AdminAPIKey)
		}
	})
	t.Run("neither", func(t *testing.T) {
		t.Setenv(config.AdminAPIKeyEnv, "")
		if c := mustLoad(t); c.AdminAPIKey != "" {
			t.Errorf("AdminAPIKey = %q, want empty", c.AdminAPIKey)
		}
	})
}

func TestValidateNamesTheFlag(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *config.Config)
		flag   string
	}{
		{"unknown policy", func(c *config.Config) { c.Policy = "least_busy" }, "--policy"},
		{"empty policy", func(c *config.Config) { c.Policy = "" }, "--policy"},
		{"url without scheme", func(c *config.Config) { c.WorkerURLs = []string{"localhost:8000"} }, "--worker-urls"},
		{"url without host", func(c *config.Config) { c.WorkerURLs = []string{"http://"} }, "--worker-urls"},
		{"url with other scheme", func(c *config.Config) { c.WorkerURLs = []string{"ftp://a:1"} }, "--worker-urls"},
		{"url with query", func(c *config.Config) { c.WorkerURLs = []string{"http://a:1/?x=1"} }, "--worker-urls"},
		{"url unparseable", func(c *config.Config) { c.WorkerURLs = []string{"http://a b:1"} }, "--worker-urls"},
		{"bad url among good", func(c *config.Config) { c.WorkerURLs = []string{"http://a:1", "b:2"} }, "--worker-urls"},
		{"negative health failure threshold", func(c *config.Config) { c.HealthFailureThreshold = -1 }, "--health-failure-threshold"},
		{"zero health success threshold", func(c *config.Config) { c.HealthSuccessThreshold = 0 }, "--health-success-threshold"},
		{"negative cb failure threshold", func(c *config.Config) { c.CBFailureThreshold = -3 }, "--cb-failure-threshold"},
		{"negative balance abs threshold", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).BalanceAbsThreshold = -1 }, "--balance-abs-threshold"},
		{"zero balance rel threshold", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).BalanceRelThreshold = 0 }, "--balance-rel-threshold"},
		{"cache threshold above 1", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).CacheThreshold = 1.5 }, "--cache-threshold"},
		{"negative cache threshold", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).CacheThreshold = -0.1 }, "--cache-threshold"},
		{"unknown load signal", func(c *config.Config) { c.LoadSignal = "gpu" }, "--load-signal"},
		{"unknown history match mode", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).HistoryMatchMode = "prefix" }, "--history-match-mode"},
		{"worker metrics interval too short", func(c *config.Config) { c.WorkerMetricsInterval = time.Millisecond }, "--worker-metrics-interval"},
		{"zero load unit tokens", func(c *config.Config) { c.LoadUnitTokens = 0 }, "--load-unit-tokens"},
		{"negative retries", func(c *config.Config) { c.RetryMaxRetries = -1 }, "--retry-max-retries"},
		{"negative backoff", func(c *config.Config) { c.RetryInitialBackoffMs = -5 }, "--retry-initial-backoff-ms"},
		{"negative max backoff", func(c *config.Config) { c.RetryMaxBackoffMs = -5 }, "--retry-max-backoff-ms"},
		{"port out of range", func(c *config.Config) { c.Port = 70000 }, "--port"},
		{"negative port", func(c *config.Config) { c.Port = -1 }, "--port"},
		{"prometheus port out of range", func(c *config.Config) { c.PrometheusPort = 65536 }, "--prometheus-port"},
		{"dp size zero", func(c *config.Config) { c.DPSize = 0 }, "--intra-node-data-parallel-size"},
		{"zero request timeout", func(c *config.Config) { c.RequestTimeoutSecs = 0 }, "--request-timeout-secs"},
		{"negative health interval", func(c *config.Config) { c.HealthCheckIntervalSecs = -1 }, "--health-check-interval-secs"},
		{"zero health timeout", func(c *config.Config) { c.HealthCheckTimeoutSecs = 0 }, "--health-check-timeout-secs"},
		{"zero cb timeout", func(c *config.Config) { c.CBTimeoutDurationSecs = 0 }, "--cb-timeout-duration-secs"},
		{"zero payload", func(c *config.Config) { c.MaxPayloadSize = 0 }, "--max-payload-size"},
		{"admin origin with a path", func(c *config.Config) { c.AdminAllowedOrigins = []string{"https://ops.example/console"} }, "--admin-allowed-origins"},
		{"admin origin any", func(c *config.Config) { c.AdminAllowedOrigins = []string{"*"} }, "--admin-allowed-origins"},
		{"kv events endpoint not tcp", func(c *config.Config) { c.KVEventsEndpoint = "ipc:///tmp/kv" }, "--kv-events-endpoint"},
		{"kv events endpoint without a port", func(c *config.Config) { c.KVEventsEndpoint = "tcp://{host}" }, "--kv-events-endpoint"},
		{"kv events replay alone", func(c *config.Config) { c.KVEventsReplayEndpoint = "tcp://{host}:5558" }, "--kv-events-replay-endpoint"},
		{"kv events bind topics without a bind", func(c *config.Config) {
			c.KVEventsBindTopics = map[string]string{"vllm-a": "http://127.0.0.1:8000"}
		}, "--kv-events-bind-topics"},
		{"kv events bind with a host placeholder", func(c *config.Config) { c.KVEventsBind = "tcp://{host}:5557" }, "--kv-events-bind"},
		{"kv events bind topic naming no URL", func(c *config.Config) {
			c.KVEventsBind, c.KVEventsBindTopics = "tcp://127.0.0.1:5557", map[string]string{"vllm-a": "not a url"}
		}, "--kv-events-bind-topics"},
		{"zero kv events index", func(c *config.Config) { c.KVEventsIndexSize = 0 }, "--kv-events-index-size"},
		{"tokenize url without events", func(c *config.Config) { c.TokenizeURL = "http://127.0.0.1:8100" }, "--tokenize-url"},
		{"tokenize url not http", func(c *config.Config) {
			c.KVEventsEndpoint, c.TokenizeURL = "tcp://{host}:5557", "ftp://127.0.0.1:8100"
		}, "--tokenize-url"},
		{"offloaded block weight above one", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).OffloadedBlockWeight = 2 }, "--kv-offloaded-block-weight"},
		{"kv events worker endpoint a wildcard", func(c *config.Config) {
			c.KVEventsWorkerEndpoints = map[string]string{"http://127.0.0.1:8000": "tcp://*:5557"}
		}, "--kv-events-worker-endpoints"},
		{"zero tokenize timeout", func(c *config.Config) { c.TokenizeTimeoutSecs = 0 }, "--tokenize-timeout-secs"},
		{"admin origin without a scheme", func(c *config.Config) { c.AdminAllowedOrigins = []string{"ops.example"} }, "--admin-allowed-origins"},
		{"negative grace", func(c *config.Config) { c.ShutdownGraceSecs = -1 }, "--shutdown-grace-secs"},
		{"body total below a body and its copy", func(c *config.Config) { c.MaxBodyBytesTotal = 2*c.MaxPayloadSize - 1 }, "--max-request-body-bytes-total"},
		{"negative body total", func(c *config.Config) { c.MaxBodyBytesTotal = -1 }, "--max-request-body-bytes-total"},
		{"client's body share below a body and its copy", func(c *config.Config) { c.MaxBodyBytesPerClient = 2*c.MaxPayloadSize - 1 }, "--max-request-body-bytes-per-client"},
		{"negative client's body share", func(c *config.Config) { c.MaxBodyBytesPerClient = -1 }, "--max-request-body-bytes-per-client"},
		{"negative total searches", func(c *config.Config) { c.ResponseSearchTotalPerSecond = -1 }, "--response-search-total-per-second"},
		{"infinite total searches", func(c *config.Config) { c.ResponseSearchTotalPerSecond = math.Inf(1) }, "--response-search-total-per-second"},
		{"endpoint without slash", func(c *config.Config) { c.HealthCheckEndpoint = "health" }, "--health-check-endpoint"},
		{"unknown log level", func(c *config.Config) { c.LogLevel = "verbose" }, "--log-level"},
		{"unknown log format", func(c *config.Config) { c.LogFormat = "xml" }, "--log-format"},
		{"otlp endpoint without a scheme", func(c *config.Config) { c.OTLPTracesEndpoint = "127.0.0.1:4318" }, "--otlp-traces-endpoint"},
		{"otlp endpoint over grpc", func(c *config.Config) { c.OTLPTracesEndpoint = "grpc://127.0.0.1:4317" }, "--otlp-traces-endpoint"},
		{"otlp endpoint over grpc with tls", func(c *config.Config) { c.OTLPTracesEndpoint = "grpcs://127.0.0.1:4317" }, "--otlp-traces-endpoint"},
		{"otlp http endpoint on the grpc port", func(c *config.Config) { c.OTLPTracesEndpoint = "http://127.0.0.1:4317" }, "--otlp-traces-endpoint"},
		{"zero tree size", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).MaxTreeSize = 0 }, "--max-tree-size"},
		{"zero sessions", func(c *config.Config) { c.MaxSessions = 0 }, "--max-sessions"},
		{"zero session ttl", func(c *config.Config) { c.SessionTTL = 0 }, "--session-ttl"},
		{"zero eviction interval", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).EvictionIntervalSecs = 0 }, "--eviction-interval-secs"},
		{"zero client header timeout", func(c *config.Config) { c.ClientHeaderTimeoutSecs = 0 }, "--client-header-timeout-secs"},
		{"negative client body timeout", func(c *config.Config) { c.ClientBodyTimeoutSecs = -1 }, "--client-body-timeout-secs"},
		{"zero keepalive timeout", func(c *config.Config) { c.KeepaliveTimeoutSecs = 0 }, "--keepalive-timeout-secs"},
		{"negative client write timeout", func(c *config.Config) { c.ClientWriteTimeoutSecs = -1 }, "--client-write-timeout-secs"},
		{"NaN client write timeout", func(c *config.Config) { c.ClientWriteTimeoutSecs = math.NaN() }, "--client-write-timeout-secs"},
		{"negative stall timeout", func(c *config.Config) { c.StallTimeoutSecs = -1 }, "--stall-timeout-secs"},
		{"zero client connections", func(c *config.Config) { c.MaxClientConnections = 0 }, "--max-client-connections"},
		{"negative client connections", func(c *config.Config) { c.MaxClientConnections = -5 }, "--max-client-connections"},
		{"zero response search concurrency", func(c *config.Config) { c.ResponseSearchConcurrency = 0 }, "--response-search-concurrency"},
		{"negative response search budget", func(c *config.Config) { c.ResponseSearchPerMinute = -1 }, "--response-search-per-minute"},
		{"negative connections per client", func(c *config.Config) { c.MaxConnectionsPerClient = -1 }, "--max-connections-per-client"},
		{"negative first byte timeout", func(c *config.Config) { c.FirstByteTimeoutSecs = -1 }, "--first-byte-timeout-secs"},
		{"NaN first byte timeout", func(c *config.Config) { c.FirstByteTimeoutSecs = math.NaN() }, "--first-byte-timeout-secs"},
		{"first byte timeout past the request timeout", func(c *config.Config) {
			c.RequestTimeoutSecs, c.FirstByteTimeoutSecs = 30, 30.5
		}, "--first-byte-timeout-secs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config.Default()
			c.WorkerURLs = []string{"http://127.0.0.1:8000"}
			tt.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate accepted it")
			}
			if !strings.Contains(err.Error(), tt.flag+":") {
				t.Errorf("error %q does not name %s", err, tt.flag)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *config.Config)
	}{
		{"every policy", nil},
		{"http and https urls with paths", func(c *config.Config) {
			c.WorkerURLs = []string{"http://127.0.0.1:8000", "https://gpu.internal", "http://[::1]:8000/vllm", "http://a:1/"}
		}},
		{"no workers yet", func(c *config.Config) { c.WorkerURLs = nil }},
		{"zero retries and thresholds at their floor", func(c *config.Config) {
			c.RetryMaxRetries, cacheaware.KnobsIn(c.PolicyOptions).BalanceAbsThreshold, c.HealthFailureThreshold, c.CBFailureThreshold = 0, 0, 1, 1
		}},
		{"metrics listener disabled", func(c *config.Config) { c.PrometheusPort = 0 }},
		{"cache threshold bounds", func(c *config.Config) { cacheaware.KnobsIn(c.PolicyOptions).CacheThreshold = 1 }},
		{"upper-case log level", func(c *config.Config) { c.LogLevel = "DEBUG" }},
		{"first byte timeout disabled", func(c *config.Config) { c.FirstByteTimeoutSecs = 0 }},
		{"first byte timeout equal to the request timeout", func(c *config.Config) {
			c.RequestTimeoutSecs, c.FirstByteTimeoutSecs = 30, 30
		}},
		{"one client connection", func(c *config.Config) { c.MaxClientConnections = 1 }},
		{"no body total", func(c *config.Config) { c.MaxBodyBytesTotal = 0 }},
		{"no client's body share", func(c *config.Config) { c.MaxBodyBytesPerClient = 0 }},
		{"a search every ten seconds, all clients together", func(c *config.Config) { c.ResponseSearchTotalPerSecond = 0.1 }},
		{"kv events endpoints", func(c *config.Config) {
			c.KVEventsEndpoint, c.KVEventsReplayEndpoint = "tcp://{host}:5557", "tcp://{host}:5558"
		}},
		{"a render service for the tokens", func(c *config.Config) {
			c.KVEventsEndpoint, c.TokenizeURL = "tcp://{host}:5557", "http://127.0.0.1:8100/"
		}},
		{"a bound kv events endpoint with replays", func(c *config.Config) {
			c.KVEventsBind, c.KVEventsReplayEndpoint = "tcp://127.0.0.1:5557", "tcp://{host}:5558"
			c.KVEventsBindTopics = map[string]string{"vllm-a": "http://127.0.0.1:8000"}
		}},
		{"admin origins with and without ports", func(c *config.Config) {
			c.AdminAllowedOrigins = []string{"https://ops.example", "http://127.0.0.1:8080"}
		}},
		{"client write timeout disabled", func(c *config.Config) { c.ClientWriteTimeoutSecs = 0 }},
		{"an otlp/http endpoint", func(c *config.Config) { c.OTLPTracesEndpoint = "https://127.0.0.1:4318/v1/traces" }},
		{"stall checks disabled", func(c *config.Config) { c.StallTimeoutSecs = 0 }},
		{"sub-second client timeouts", func(c *config.Config) {
			c.ClientHeaderTimeoutSecs, c.ClientBodyTimeoutSecs, c.KeepaliveTimeoutSecs = 0.25, 0.5, 0.1
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config.Default()
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	for _, p := range registry.Names() {
		c := config.Default()
		c.Policy = p
		if err := c.Validate(); err != nil {
			t.Errorf("policy %q rejected: %v", p, err)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := config.Default()
	c.Policy = "nope"
	c.WorkerURLs = []string{"localhost:8000"}
	c.HealthFailureThreshold = -2
	wantErrorNaming(t, c.Validate(), "Validate accepted three bad values", "--policy", "--worker-urls", "--health-failure-threshold")
}

// The first-byte deadline is one attempt's share of the whole request's: a value above
// --request-timeout-secs could never fire, so it is rejected with both flags named.
func TestFirstByteTimeoutBoundedByRequestTimeout(t *testing.T) {
	_, _, err := load(t, "--request-timeout-secs", "20", "--first-byte-timeout-secs", "60")
	wantErrorNaming(t, err, "Load accepted a first-byte timeout above the request timeout", "--first-byte-timeout-secs", "--request-timeout-secs")
	if c := mustLoad(t, "--request-timeout-secs", "20", "--first-byte-timeout-secs", "0"); c.FirstByteTimeout() != 0 {
		t.Errorf("FirstByteTimeout() = %v with --first-byte-timeout-secs 0, want 0 (disabled)", c.FirstByteTimeout())
	}
	t.Run("set in the file, above the flag's request timeout", func(t *testing.T) {
		_, _, err := load(t, "--config", writeYAML(t, "first_byte_timeout_secs: 45\n"), "--request-timeout-secs", "30")
		if err == nil || !strings.Contains(err.Error(), "--first-byte-timeout-secs") {
			t.Errorf("err = %v, want one naming --first-byte-timeout-secs", err)
		}
	})
	t.Run("an invalid request timeout is reported once, on its own flag", func(t *testing.T) {
		c := config.Default()
		c.RequestTimeoutSecs = 0
		err := c.Validate()
		if err == nil || strings.Contains(err.Error(), "--first-byte-timeout-secs") {
			t.Errorf("err = %v, want one naming only --request-timeout-secs", err)
		}
	})
}

// A request timeout lowered below the default first-byte timeout, with no first-byte timeout
// given, is a configuration from before the first-byte deadline existed: it loads, with the
// deadline off, instead of failing on a flag its author never set.
func TestLowRequestTimeoutAloneTurnsTheDefaultFirstByteTimeoutOff(t *testing.T) {
	tests := []struct {
		name string
		args func(t *testing.T) []string
		want float64
	}{
		{"flag", func(*testing.T) []string { return []string{"--request-timeout-secs", "30"} }, 0},
		{"file", func(t *testing.T) []string {
			return []string{"--config", writeYAML(t, "request_timeout_secs: 0.5\n")}
		}, 0},
		{"file, with a first-byte timeout that fits", func(t *testing.T) []string {
			return []string{"--config", writeYAML(t, "request_timeout_secs: 30\nfirst_byte_timeout_secs: 10\n")}
		}, 10},
		{"request timeout above the default keeps it", func(*testing.T) []string {
			return []string{"--request-timeout-secs", "120"}
		}, 60},
		{"request timeout equal to the default keeps it", func(*testing.T) []string {
			return []string{"--request-timeout-secs", "60"}
		}, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustLoad(t, tt.args(t)...); c.FirstByteTimeoutSecs != tt.want {
				t.Errorf("FirstByteTimeoutSecs = %v, want %v", c.FirstByteTimeoutSecs, tt.want)
			}
		})
	}
}

func TestLoadRejectsInvalidFlags(t *testing.T) {
	tests := []struct {
		args []string
		flag string
	}{
		{[]string{"--policy", "fastest"}, "--policy"},
		{[]string{"--worker-urls", "localhost:8000"}, "--worker-urls"},
		{[]string{"--worker-urls", "http://"}, "--worker-urls"},
		{[]string{"--cb-failure-threshold", "-1"}, "--cb-failure-threshold"},
		{[]string{"--max-client-connections", "0"}, "--max-client-connections"},
		{[]string{"--keepalive-timeout-secs", "-1"}, "--keepalive-timeout-secs"},
	}
	for _, tt := range tests {
		_, _, err := load(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("Load %q: err = %v, want one naming %s", tt.args, err, tt.flag)
		}
	}
}

func TestDurations(t *testing.T) {
	c := config.Default()
	c.RequestTimeoutSecs = 1.5
	c.ClientHeaderTimeoutSecs = 0.25
	c.RetryInitialBackoffMs = 50
	c.RetryMaxBackoffMs = 2000
	checks := []struct {
		name      string
		got, want time.Duration
	}{
		{"RequestTimeout", c.RequestTimeout(), 1500 * time.Millisecond},
		{"FirstByteTimeout", c.FirstByteTimeout(), 60 * time.Second},
		{"ClientHeaderTimeout", c.ClientHeaderTimeout(), 250 * time.Millisecond},
		{"ClientBodyTimeout", c.ClientBodyTimeout(), 60 * time.Second},
		{"KeepaliveTimeout", c.KeepaliveTimeout(), 75 * time.Second},
		{"HealthCheckInterval", c.HealthCheckInterval(), 10 * time.Second},
		{"HealthCheckTimeout", c.HealthCheckTimeout(), 5 * time.Second},
		{"CBTimeout", c.CBTimeout(), 30 * time.Second},
		{"ShutdownGrace", c.ShutdownGrace(), 30 * time.Second},
		{"EvictionInterval", cacheaware.KnobsIn(c.PolicyOptions).EvictionInterval(), 120 * time.Second},
		{"RetryInitialBackoff", c.RetryInitialBackoff(), 50 * time.Millisecond},
		{"RetryMaxBackoff", c.RetryMaxBackoff(), 2 * time.Second},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

// writeFile writes a small file under dir and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTLSCertificateAndKeyFlagsComeInPairs(t *testing.T) {
	dir := t.TempDir()
	pem := writeFile(t, dir, "a.pem", "x")
	tests := []struct {
		name   string
		mutate func(c *config.Config)
		flag   string
	}{
		{"listener cert without key", func(c *config.Config) { c.TLSCertFile = pem }, "--tls-key-file: required with --tls-cert-file"},
		{"listener key without cert", func(c *config.Config) { c.TLSKeyFile = pem }, "--tls-cert-file: required with --tls-key-file"},
		{"worker client cert without key", func(c *config.Config) { c.WorkerClientCertFile = pem }, "--worker-client-key-file: required with --worker-client-cert-file"},
		{"worker client key without cert", func(c *config.Config) { c.WorkerClientKeyFile = pem }, "--worker-client-cert-file: required with --worker-client-key-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config.Default()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.flag) {
				t.Fatalf("Validate = %v, want an error with %q", err, tt.flag)
			}
		})
	}
}

func TestTLSFilesThatCannotBeReadAreRejectedAtStartup(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "absent.pem")
	for _, flag := range []string{"tls-cert-file", "tls-key-file", "worker-ca-file", "worker-client-cert-file", "worker-client-key-file"} {
		t.Run(flag, func(t *testing.T) {
			args := []string{"--" + flag, missing}
			// The other half of a pair exists, so the only problem is the unreadable file.
			switch flag {
			case "tls-cert-file":
				args = append(args, "--tls-key-file", writeFile(t, dir, "k.pem", "x"))
			case "tls-key-file":
				args = append(args, "--tls-cert-file", writeFile(t, dir, "c.pem", "x"))
			case "worker-client-cert-file":
				args = append(args, "--worker-client-key-file", writeFile(t, dir, "k.pem", "x"))
			case "worker-client-key-file":
				args = append(args, "--worker-client-cert-file", writeFile(t, dir, "c.pem", "x"))
			}
			_, _, err := load(t, args...)
			if err == nil {
				t.Fatal("Load accepted a file that does not exist")
			}
			if msg := err.Error(); !strings.Contains(msg, "--"+flag+": cannot read the file") || !strings.Contains(msg, missing) {
				t.Errorf("error %q does not name --%s and the file", msg, flag)
			}
		})
	}
	t.Run("a directory", func(t *testing.T) {
		c := config.Default()
		c.WorkerCAFile = dir
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--worker-ca-file: cannot read the file") {
			t.Fatalf("Validate = %v, want --worker-ca-file unreadable", err)
		}
	})
}

func TestTLSFilesLoadFromFlagsAndFromTheConfigFile(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeFile(t, dir, "c.pem", "x"), writeFile(t, dir, "k.pem", "x")
	ca := writeFile(t, dir, "ca.pem", "x")
	c := mustLoad(t, "--tls-cert-file", cert, "--tls-key-file", key, "--worker-ca-file", ca,
		"--worker-client-cert-file", cert, "--worker-client-key-file", key)
	if c.TLSCertFile != cert || c.TLSKeyFile != key || c.WorkerCAFile != ca || c.WorkerClientCertFile != cert || c.WorkerClientKeyFile != key {
		t.Errorf("flags not loaded: %+v", c)
	}
	file := writeFile(t, dir, "router.yaml", "tls_cert_file: "+cert+"\ntls_key_file: "+key+
		"\nsession_store: redis\nredis_url: rediss://127.0.0.1:6380\nredis_ca_file: "+ca+"\n")
	c = mustLoad(t, "--config", file)
	if c.TLSCertFile != cert || c.TLSKeyFile != key || c.RedisCAFile != ca {
		t.Errorf("file keys not loaded: %+v", c)
	}
}

func TestRedisCAFileNeedsATLSRedisURL(t *testing.T) {
	ca := writeFile(t, t.TempDir(), "ca.pem", "x")
	c := config.Default()
	c.SessionStore, c.RedisURL, c.RedisCAFile = "redis", "redis://127.0.0.1:6379", ca
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--redis-ca-file: needs a rediss://") {
		t.Fatalf("Validate = %v, want --redis-ca-file to ask for rediss://", err)
	}
	c.RedisURL = "rediss://127.0.0.1:6380"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate with rediss://: %v", err)
	}
}

// A worker given as its OpenAI base URL (".../v1") stops the start, from the command line and from
// the config file alike, with a message under --worker-urls that says what to give instead.
func TestWorkerURLEndingInV1StopsTheStartWithTheURLToGive(t *testing.T) {
	file := writeYAML(t, "worker_urls: [\"http://10.0.0.1:8000/v1\"]\n")
	for name, args := range map[string][]string{
		"flag":        {"--worker-urls", "http://127.0.0.1:8000", "http://10.0.0.1:8000/v1/"},
		"config file": {"--config", file},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := load(t, args...)
			wantErrorNaming(t, err, "accepted a worker URL ending in /v1", "--worker-urls:", "ends in /v1", `"http://10.0.0.1:8000"`)
		})
	}
}

// A router with no worker, no discovery and no --allow-empty would answer 503 to everything
// after a normal-looking start: the check says what to give instead.
func TestNoWorkerSourceIsAnErrorUnlessAllowEmpty(t *testing.T) {
	wantErrorNaming(t, mustLoad(t).RequireWorkerSource(), "no workers and no discovery accepted",
		"--worker-urls", "--service-discovery", "--dns-discovery", "--allow-empty", "admin API")
	for name, c := range map[string]config.Config{
		"static workers":                 mustLoad(t, "--worker-urls", "http://127.0.0.1:8000"),
		"allow empty":                    mustLoad(t, "--allow-empty"),
		"allow empty in the config file": mustLoad(t, "--config", writeYAML(t, "allow_empty: true\n")),
		"dns discovery":                  mustLoad(t, "--dns-discovery", "vllm.default.svc:8000"),
	} {
		if err := c.RequireWorkerSource(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := config.Default()
	c.ServiceDiscovery, c.Selector = true, []string{"app=vllm"}
	if err := c.RequireWorkerSource(); err != nil {
		t.Errorf("service discovery: %v", err)
	}
}
