package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/redisproc"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// PolicySpec is one in-process router to compare: a policy, how requests name their session,
// and the router flags it runs with. It is written [NAME=]POLICY[:MODE] (MODE one of header,
// body, none), e.g. cache_aware:none for cache_aware driven by the conversation history alone,
// or engine=cache_aware for a cache_aware router that --router-arg engine=... configures; without
// NAME the entry is named as written.
type PolicySpec struct {
	Name        string
	Policy      string
	SessionMode string
	// Args are router flags (--flag=value, or a bare boolean --flag), applied in order over the
	// bench's configuration; see ApplyRouterArgs.
	Args []string
}

// ParsePolicies reads a comma-separated list of PolicySpecs; entries without a mode take
// defaultMode. Names must be unique.
func ParsePolicies(list []string, defaultMode string) ([]PolicySpec, error) {
	var out []PolicySpec
	err := namedEntries(list, "--policies", "NAME=POLICY[:MODE]", func(e, name, spec string) error {
		pol, mode, hasMode := strings.Cut(spec, ":")
		if !hasMode {
			mode = defaultMode
		}
		if _, ok := registry.Lookup(pol); !ok && !routerless(pol) {
			return fmt.Errorf("--policies: unknown policy %q (want one of %s, %s or %s)", pol, strings.Join(registry.Names(), ", "), OraclePolicy, HAProxyPolicy)
		}
		if !slices.Contains(SessionModes, mode) {
			return fmt.Errorf("--policies %s: session id mode %q is not one of %s", e, mode, strings.Join(SessionModes, ", "))
		}
		out = append(out, PolicySpec{Name: name, Policy: pol, SessionMode: mode})
		return nil
	})
	return out, err
}

// namedEntries calls fn with each entry of the comma-separated lists of flag, its name and what
// follows the name: an entry NAME=SPEC (form says how flag's entries are written), or SPEC alone,
// named as written. Names must be unique, and neither start with - nor hold spaces.
func namedEntries(list []string, flag, form string, fn func(entry, name, spec string) error) error {
	seen := map[string]bool{}
	for _, item := range list {
		for _, e := range strings.Split(item, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			name, spec, named := strings.Cut(e, "=")
			if !named {
				name, spec = e, e
			} else if name = strings.TrimSpace(name); name == "" || strings.HasPrefix(name, "-") || strings.ContainsAny(name, " \t") {
				return fmt.Errorf("%s %s: want %s with a NAME that neither starts with - nor holds spaces", flag, e, form)
			}
			if seen[name] {
				return fmt.Errorf("%s: entry name %s given twice", flag, name)
			}
			seen[name] = true
			if err := fn(e, name, strings.TrimSpace(spec)); err != nil {
				return err
			}
		}
	}
	return nil
}

// TargetSpec is an external target: NAME=URL[,URL...].
type TargetSpec struct {
	Name string
	URLs []string
}

// ParseTarget reads NAME=URL[,URL...]. With several URLs, the target's requests are spread
// over them round-robin.
func ParseTarget(s string) (TargetSpec, error) {
	name, list, ok := strings.Cut(s, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" {
		return TargetSpec{}, fmt.Errorf("--target %q: want NAME=URL[,URL...]", s)
	}
	var urls []string
	for _, u := range strings.Split(list, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u == "" {
			continue
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return TargetSpec{}, fmt.Errorf("--target %s: %q is not an http(s) URL", name, u)
		}
		urls = append(urls, u)
	}
	if len(urls) == 0 {
		return TargetSpec{}, fmt.Errorf("--target %s: no URL", name)
	}
	return TargetSpec{Name: name, URLs: urls}, nil
}

// Options describe a whole bench: one workload, the targets to run it against.
type Options struct {
	Workload Workload
	Params   map[string]any // recorded in the report as given

	// Policies are in-process routers, each in front of the same Workers simulated workers
	// configured by Sim; the fleet's caches are emptied between runs. With Replicas above 1,
	// each entry runs that many routers sharing their session map through a redis-server the
	// bench starts, and requests go to them round-robin.
	Policies []PolicySpec
	Workers  int
	Replicas int // 0 is 1
	Sim      sim.Config
	// KVOversubscription, when positive, sizes the simulated workers' KV caches (Sim's
	// KVCacheBlocks) so that the workload's planned working set (Workload.PlannedWorkingSet at
	// Concurrency) is that many times their total capacity.
	KVOversubscription float64
	// KVEvents has the simulated workers publish their KV-cache events and the routers
	// subscribe, each worker on a loopback port of its own.
	KVEvents bool
	// PrefillWorkers and DecodeWorkers, both set, run every entry twice over a fleet of their
	// sum: colocated, then as a P/D fleet (the first PrefillWorkers prefill, the others decode)
	// under the entry's name with "/pd" appended. Workers is then their sum.
	PrefillWorkers, DecodeWorkers int

	// Targets are external endpoints, run with SessionMode. WorkerMetrics are the base URLs of
	// the workers behind them, scraped for cache counters and in-flight loads.
	Targets         []TargetSpec
	SessionMode     string
	WorkerMetrics   []string
	TargetTimeScale float64 // time scale of simulated workers behind Targets (1 for real ones)

	// Fronts, instead of Policies and Targets, send the workload to one simulated worker
	// configured by Sim straight and through each front in turn (see FrontSpec), and report what
	// each front adds per request. RouterCommand starts a router front as a process of its own:
	// the program and any leading arguments (the bench's own binary), the router's flags after.
	Fronts        []FrontSpec
	RouterCommand []string
	// FrontIdle is how long the fronts' CPU is read idle before the runs (0: 2 s), and
	// FrontRound the requests of each round the fronts take in turn (whole sessions, at least
	// that many; 0: the whole workload through each front in turn).
	FrontIdle  time.Duration
	FrontRound int

	// API is how each turn is sent: one of APIs, "" for chat.
	API         string
	Model       string // empty: the in-process sims' model, or the first one a target lists
	Concurrency int
	Timeout     time.Duration // per request
	Progress    *Progress

	// Ports confines every port the in-process run listens on (workers, their event publishers,
	// routers, the oracle) to a range; the zero value lets the system choose.
	Ports PortRange
	ports *ports // hands out Ports' ports during the run
}

// Run runs the workload against every in-process policy, then every external target, and
// returns the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if len(o.Policies) == 0 && len(o.Targets) == 0 && len(o.Fronts) == 0 {
		return nil, errors.New("nothing to run: give --policies, --target or --fronts")
	}
	if o.Concurrency < 1 {
		return nil, fmt.Errorf("--concurrency must be at least 1, got %d", o.Concurrency)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.API == "" {
		o.API = APIChat
	}
	if _, err := apiFor(o.API); err != nil {
		return nil, err
	}
	if o.Ports.Set() {
		if o.Replicas > 1 {
			return nil, errors.New("--port-range does not confine the redis-server that --replicas starts")
		}
		if need := o.listeners(); need > o.Ports.Size() {
			return nil, fmt.Errorf("--port-range %s holds %d ports; this run listens on %d", o.Ports, o.Ports.Size(), need)
		}
		o.ports = newPorts(o.Ports)
	}
	rep := &Report{
		Workload: o.Workload.Name, API: o.API, Params: o.Params, Sessions: len(o.Workload.Sessions),
		Requests: o.Workload.Requests(), Concurrency: o.Concurrency, TimeScale: 1, ReuseCeiling: o.Workload.ReuseCeiling,
	}
	if len(o.Fronts) > 0 {
		return rep, runFronts(ctx, o, rep)
	}
	if len(o.Policies) > 0 {
		rep.TimeScale = o.Sim.TimeScale
		if err := runPolicies(ctx, o, rep); err != nil {
			return rep, err
		}
	}
	if len(o.Targets) > 0 {
		if len(o.Policies) == 0 && o.TargetTimeScale > 0 {
			rep.TimeScale = o.TargetTimeScale
		}
		if err := runTargets(ctx, o, rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runPolicies starts the simulated fleet and, for each policy in turn, its routers.
func runPolicies(ctx context.Context, o Options, rep *Report) error {
	if (o.PrefillWorkers > 0) != (o.DecodeWorkers > 0) || o.PrefillWorkers < 0 || o.DecodeWorkers < 0 {
		return fmt.Errorf("--prefill-workers and --decode-workers go together, each at least 1 (got %d and %d)", o.PrefillWorkers, o.DecodeWorkers)
	}
	pd := o.PrefillWorkers > 0
	if pd {
		o.Workers = o.PrefillWorkers + o.DecodeWorkers
	}
	if o.Workers < 1 {
		return fmt.Errorf("--workers must be at least 1, got %d", o.Workers)
	}
	if o.KVOversubscription > 0 {
		blocks, err := o.Workload.KVBlocksFor(o.KVOversubscription, o.Concurrency, o.Workers, o.Sim.BlockSize)
		if err != nil {
			return err
		}
		o.Sim.KVCacheBlocks = blocks
		if rep.Params == nil {
			rep.Params = map[string]any{}
		}
		rep.Params["kv_cache_blocks"] = blocks
	}
	replicas := max(o.Replicas, 1)
	var store *redisproc.Server
	if replicas > 1 {
		s, err := redisproc.Start("")
		if err != nil {
			return fmt.Errorf("--replicas %d shares the session map through Redis: %w", replicas, err)
		}
		defer s.Close()
		store = s
	}
	simCfg := o.Sim
	base := 0
	if o.KVEvents {
		var err error
		if base, err = o.ports.consecutive(o.Workers); err != nil {
			return fmt.Errorf("the workers' KV-cache events: %w", err)
		}
		simCfg.KVEvents = sim.KVEventsConfig{Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(base), Bind: true} // worker n: base+n
	}
	fleet, err := o.ports.startSims(o.Workers, simCfg)
	if err != nil {
		return err
	}
	defer fleet.Close()
	var events map[string]string // worker URL → its event endpoint
	if o.KVEvents {
		events = map[string]string{}
		for i, u := range fleet.URLs() {
			events[u] = "tcp://127.0.0.1:" + strconv.Itoa(base+i)
		}
	}
	model := o.Model
	if model == "" {
		model = o.Sim.Models[0]
	}
	for _, p := range o.Policies {
		if err := resetFleet(ctx, fleet); err != nil {
			return err
		}
		redisURL := ""
		if store != nil {
			if err := store.FlushAll(ctx); err != nil {
				return fmt.Errorf("emptying the session store: %w", err)
			}
			redisURL = store.URL()
		}
		if p.Policy == OraclePolicy {
			if err := runOracle(ctx, &o, rep, p, fleet, model); err != nil {
				return err
			}
			continue
		}
		if p.Policy == HAProxyPolicy {
			if err := runHAProxy(ctx, &o, rep, p, fleet, model); err != nil {
				return err
			}
			continue
		}
		cfg, err := routerConfig(p, fleet.URLs(), redisURL, o.Sim.TimeScale)
		if err != nil {
			return err
		}
		cfg.KVEventsWorkerEndpoints = events
		if err := runEntry(ctx, &o, rep, p, cfg, fleet, model, replicas, ""); err != nil {
			return err
		}
		if !pd {
			continue
		}
		if err := resetFleet(ctx, fleet); err != nil {
			return err
		}
		if store != nil {
			if err := store.FlushAll(ctx); err != nil {
				return fmt.Errorf("emptying the session store: %w", err)
			}
		}
		cfg.PDDisaggregation = true
		if err := runEntry(ctx, &o, rep, p, cfg, fleet, model, replicas, pdSuffix); err != nil {
			return err
		}
	}
	return nil
}

// kvCapacity is the KV cache of the whole simulated fleet, in tokens.
func (o *Options) kvCapacity() int64 {
	return int64(o.Workers) * int64(o.Sim.KVCacheBlocks) * int64(o.Sim.BlockSize)
}

// pdSuffix names an entry's P/D run.
const pdSuffix = "/pd"

// runEntry runs the workload through replicas routers of configuration cfg over fleet, as the
// target named p.Name+suffix. A P/D run (cfg.PDDisaggregation) gives the first o.PrefillWorkers
// workers the prefill role and the others decode.
func runEntry(ctx context.Context, o *Options, rep *Report, p PolicySpec, cfg config.Config, fleet *sim.Fleet, model string, replicas int, suffix string) error {
	if cfg.PDDisaggregation {
		urls := fleet.URLs()
		cfg.WorkerURLs, cfg.Prefill, cfg.Decode = nil, urls[:o.PrefillWorkers], urls[o.PrefillWorkers:]
	}
	rs, err := startReplicas(ctx, cfg, p.Name+suffix, replicas, o.ports)
	if err != nil {
		return err
	}
	defer rs.stop()
	t := &Target{Name: p.Name + suffix, URLs: rs.urls(), SessionMode: p.SessionMode, Policy: p.Policy,
		RouterArgs: p.Args, Replicas: replicas, SessionStore: cfg.SessionStore,
		Loads: rs.loads, Workers: o.Workers, WorkerMetrics: fleet.URLs(), TimeScale: o.Sim.TimeScale, KVCapacityTokens: o.kvCapacity()}
	calls0, cached0 := rs.tokenizeCalls()
	tr, err := runOne(ctx, o, t, model)
	if err != nil {
		return err
	}
	if o.KVEvents {
		setTokenizeCalls(&tr, rs, calls0, cached0)
	}
	rep.Targets = append(rep.Targets, tr)
	return ctx.Err()
}

// runOracle runs the workload through the oracle over fleet.
func runOracle(ctx context.Context, o *Options, rep *Report, p PolicySpec, fleet *sim.Fleet, model string) error {
	if o.API != "" && o.API != APIChat {
		return fmt.Errorf("--policies %s: the oracle routes chat completions only, not --api %s", p.Name, o.API)
	}
	or, err := startOracle(fleet, o.ports)
	if err != nil {
		return err
	}
	defer or.stop()
	t := &Target{Name: p.Name, URLs: []string{or.url}, SessionMode: p.SessionMode, Policy: p.Policy,
		Loads: or.loads, Workers: o.Workers, WorkerMetrics: fleet.URLs(), TimeScale: o.Sim.TimeScale, KVCapacityTokens: o.kvCapacity()}
	tr, err := runOne(ctx, o, t, model)
	if err != nil {
		return err
	}
	rep.Targets = append(rep.Targets, tr)
	return ctx.Err()
}

// runTargets runs the workload against each external target.
func runTargets(ctx context.Context, o Options, rep *Report) error {
	client := newHTTPClient(4, 10*time.Second)
	defer client.CloseIdleConnections()
	for _, spec := range o.Targets {
		model := o.Model
		if model == "" {
			m, err := discoverModel(ctx, client, spec.URLs[0])
			if err != nil {
				return err
			}
			model = m
		}
		t := &Target{Name: spec.Name, URLs: spec.URLs, SessionMode: o.SessionMode,
			WorkerMetrics: o.WorkerMetrics, TimeScale: o.TargetTimeScale, Workers: len(o.WorkerMetrics)}
		if len(o.WorkerMetrics) > 0 {
			t.Loads = scrapedLoads(newHTTPClient(len(o.WorkerMetrics), 5*time.Second), o.WorkerMetrics)
		}
		tr, err := runOne(ctx, &o, t, model)
		if err != nil {
			return err
		}
		rep.Targets = append(rep.Targets, tr)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// scrapedSampleInterval is the sampling period of loads scraped from worker /metrics behind real
// workers (time scale 1). Behind simulated workers it is multiplied by their time scale, down to
// the router's shortest scrape period (atScale), so that a window of ImbalanceWindow samples covers one full-scale
// second whatever the time scale, as an in-process router's 10 ms samples do at time scale 0.1:
// the same router then reads the same imbalance in process and behind --target.
const scrapedSampleInterval = 100 * time.Millisecond

// scrapedInterval is the sampling period of scraped loads for workers at time scale scale.
func scrapedInterval(scale float64) time.Duration { return atScale(scrapedSampleInterval, scale) }

// atScale is the period d for workers at time scale scale (as 1 when not positive), never below
// the shortest /metrics scrape period a router accepts.
func atScale(d time.Duration, scale float64) time.Duration {
	if scale <= 0 {
		scale = 1
	}
	return max(config.MinWorkerMetricsInterval, time.Duration(float64(d)*scale))
}

// runOne runs the workload against t, with worker cache counters read before and after.
func runOne(ctx context.Context, o *Options, t *Target, model string) (TargetReport, error) {
	hc := newHTTPClient(4, 10*time.Second)
	defer hc.CloseIdleConnections()
	var c0 workerCounters
	var metricsErr error
	if len(t.WorkerMetrics) > 0 {
		c0, metricsErr = cacheCounters(ctx, hc, t.WorkerMetrics)
	}
	interval := time.Duration(0)
	if t.Policy == "" {
		interval = scrapedInterval(t.TimeScale)
	}
	o.Progress.begin(t.Name, o.Workload.Requests())
	res := run(ctx, &o.Workload, t, RunOptions{API: o.API, Model: model, Concurrency: o.Concurrency, Timeout: o.Timeout,
		SampleInterval: interval, Progress: o.Progress})
	o.Progress.end()
	if res.failed != nil {
		return TargetReport{}, res.failed
	}
	scale := t.TimeScale
	tr := summarize(t, res, scale)
	if len(t.WorkerMetrics) > 0 && metricsErr == nil {
		if c1, err := cacheCounters(ctx, hc, t.WorkerMetrics); err == nil {
			if c1.queries > c0.queries {
				v := (c1.hits - c0.hits) / (c1.queries - c0.queries)
				tr.WorkerHitRate = &v
			}
			if c0.hasPreemptions && c1.hasPreemptions {
				p := c1.preemptions - c0.preemptions
				tr.Preemptions = &p
			}
		}
	}
	return tr, nil
}

// listeners is the number of loopback ports an in-process run listens on: each simulated worker
// (and its event publisher, with KVEvents), and each entry's routers (twice over for P/D) or its
// oracle; with Fronts, the one worker, its event publisher and each front.
func (o *Options) listeners() int {
	if len(o.Fronts) > 0 {
		return 2 + len(o.Fronts)
	}
	workers := o.Workers
	pd := o.PrefillWorkers > 0 && o.DecodeWorkers > 0
	if pd {
		workers = o.PrefillWorkers + o.DecodeWorkers
	}
	n := workers
	if o.KVEvents {
		n += workers
	}
	for _, p := range o.Policies {
		switch {
		case p.Policy == OraclePolicy:
			n++
		case pd:
			n += 2 * max(o.Replicas, 1)
		default:
			n += max(o.Replicas, 1)
		}
	}
	return n
}
