package bench

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/cacheroute/cacheroute/internal/config"
)

// benchOwnedFlags are the router flags the bench sets itself on every in-process router: where
// it listens, its workers (the simulated fleet, never discovered), its policy (the --policies
// entry) and its session store (memory, or the bench's redis-server with --replicas). A
// --router-arg naming one of them is refused rather than silently overridden, except
// --session-store=memory: with --replicas it keeps an entry's replicas from sharing sessions.
var benchOwnedFlags = []string{
	"host", "port", "prometheus-port", "worker-urls", "prefill", "decode", "vllm-pd-disaggregation", "policy", "session-store", "redis-url",
	"service-discovery", "selector", "service-discovery-port", "service-discovery-namespace",
	"kubeconfig", "dns-discovery", "dns-refresh-secs", "prefill-selector", "decode-selector",
}

// configFileFlag is the router flag naming a YAML configuration file, accepted as a router arg.
const configFileFlag = "config"

// ApplyRouterArgs hands each --router-arg to the entries it is for: ARG (a router flag, such as
// --load-signal=engine) to every entry, ENTRY=ARG to the entry named ENTRY only. Each entry
// keeps its args in the order given. Every entry's configuration is then built once, so that a
// bad flag or value is reported before anything starts.
func ApplyRouterArgs(specs []PolicySpec, args []string) error {
	for _, a := range args {
		entry, arg := "", a
		if !strings.HasPrefix(a, "-") {
			var ok bool
			if entry, arg, ok = strings.Cut(a, "="); !ok || !strings.HasPrefix(arg, "-") {
				return fmt.Errorf("--router-arg %q: want a router flag (--flag=value) or ENTRY=--flag=value", a)
			}
		}
		found := false
		for i := range specs {
			switch {
			case routerless(specs[i].Policy) && specs[i].Name == entry:
				return fmt.Errorf("--router-arg %s: entry %s is %s, which runs no router", a, entry, specs[i].Policy)
			case routerless(specs[i].Policy):
			case entry == "" || specs[i].Name == entry:
				specs[i].Args = append(specs[i].Args, arg)
				found = true
			}
		}
		if !found {
			names := make([]string, len(specs))
			for i := range specs {
				names[i] = specs[i].Name
			}
			if entry == "" {
				return fmt.Errorf("--router-arg %s: no --policies entry to apply it to", arg)
			}
			return fmt.Errorf("--router-arg %s: no --policies entry named %q (entries: %s)", a, entry, strings.Join(names, ", "))
		}
	}
	for _, p := range specs {
		if routerless(p.Policy) {
			continue
		}
		// Placeholders stand for the fleet and the redis-server, which do not exist yet.
		if _, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "", 1); err != nil {
			return err
		}
		if _, err := routerConfig(p, []string{"http://127.0.0.1:1"}, "redis://127.0.0.1:1", 1); err != nil {
			return err
		}
	}
	return nil
}

// routerConfig is the configuration of one in-process router of entry p: config.Default() with
// the bench's own settings, then p's router args (and the YAML file one of them names), then
// validated. A non-empty redisURL gives the router the shared Redis session store.
//
// Its /metrics scrape runs at the workers' time scale (scrapedInterval: 10 ms at the bench's
// 0.1), as every other duration in the bench does: at the default 100 ms against workers that
// run ten times faster, each replica would route on figures ten times as stale, relative to its
// requests, as in a real fleet. A --worker-metrics-interval router arg still decides.
func routerConfig(p PolicySpec, workerURLs []string, redisURL string, timeScale float64) (config.Config, error) {
	cfg := config.Default()
	cfg.WorkerMetricsInterval = atScale(cfg.WorkerMetricsInterval, timeScale)
	cfg.ShutdownGraceSecs = 5
	cfg.LogLevel = "error"
	fs := pflag.NewFlagSet(p.Name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	config.BindFlags(fs, &cfg)
	var file string
	fs.StringVar(&file, configFileFlag, "", "YAML configuration file")
	for _, arg := range p.Args {
		if err := fs.Parse([]string{arg}); err != nil {
			return cfg, fmt.Errorf("--policies entry %s: --router-arg %s: %v", p.Name, arg, err)
		}
		if rest := fs.Args(); len(rest) > 0 {
			return cfg, fmt.Errorf("--policies entry %s: --router-arg %s: not a flag (give values as --flag=value)", p.Name, arg)
		}
	}
	var owned error
	fs.Visit(func(f *pflag.Flag) {
		if f.Name == "session-store" && f.Value.String() == "memory" {
			return
		}
		if owned == nil && slices.Contains(benchOwnedFlags, f.Name) {
			owned = fmt.Errorf("--policies entry %s: --router-arg --%s: the bench sets --%s itself (use --policies, --replicas and the fleet flags)", p.Name, f.Name, f.Name)
		}
	})
	if owned != nil {
		return cfg, owned
	}
	if file != "" {
		var err error
		if cfg, err = loadConfigFile(fs, cfg, file); err != nil {
			return cfg, fmt.Errorf("--policies entry %s: --router-arg --config=%s: %w", p.Name, file, err)
		}
	}
	cfg.Policy = p.Policy
	cfg.WorkerURLs = workerURLs
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.PrometheusPort = 0
	cfg.ServiceDiscovery, cfg.DNSDiscovery = false, ""
	cfg.SessionStore, cfg.RedisURL = "memory", ""
	if redisURL != "" && !fs.Changed("session-store") {
		cfg.SessionStore, cfg.RedisURL = "redis", redisURL
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("--policies entry %s: %w", p.Name, err)
	}
	return cfg, nil
}

// loadConfigFile applies a router YAML file through config.Load, the router's own loader (the
// file over the defaults, the flags given over the file), refusing keys the bench owns. The
// bench's quieter defaults (shutdown grace, log level) stay unless the file or a flag sets them.
func loadConfigFile(fs *pflag.FlagSet, flagged config.Config, file string) (config.Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return flagged, err
	}
	var keys map[string]any
	if err := yaml.Unmarshal(data, &keys); err != nil {
		return flagged, err
	}
	for _, f := range benchOwnedFlags {
		if _, ok := keys[strings.ReplaceAll(f, "-", "_")]; ok {
			return flagged, fmt.Errorf("sets %s, which the bench sets itself", strings.ReplaceAll(f, "-", "_"))
		}
	}
	cfg, err := config.Load(fs, &flagged, file)
	if err != nil {
		return cfg, err
	}
	// Load starts the file from config.Default(); what neither the file nor a flag set keeps
	// the bench's value (flagged holds the flags given, over the bench's defaults).
	if _, ok := keys["shutdown_grace_secs"]; !ok {
		cfg.ShutdownGraceSecs = flagged.ShutdownGraceSecs
	}
	if _, ok := keys["log_level"]; !ok {
		cfg.LogLevel = flagged.LogLevel
	}
	return cfg, nil
}
