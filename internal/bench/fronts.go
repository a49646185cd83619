package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/haproxyproc"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// fronts.go is the --fronts comparison: what a front (a proxy or a router) costs on the data path.
// The same requests, in the same order, go to one simulated worker straight (direct) and through
// each front, the fronts taking turns on rounds of whole sessions, the worker's cache emptied
// before each turn. Each request's TTFT and E2E
// through a front are paired with the same request's sent direct, and the front's CPU time is read
// from /proc for its own process (a cacheroute router runs as one, from the bench's binary).

// Fronts other than routers and HAProxy.
const (
	// FrontDirect sends the requests to the worker itself: the baseline every front is paired with.
	FrontDirect = "direct"
	// FrontNginx is nginx (from PATH) in front of the worker, kept-alive, unbuffered.
	FrontNginx = "nginx"
)

// eventsSuffix, after a router front, has the worker publish its KV-cache events and the router
// subscribe (and ask the worker's /tokenize for what the events may route).
const eventsSuffix = "+events"

// FrontSpec is one front of a --fronts comparison, written [NAME=]FRONT[:MODE][+events]: FRONT
// is direct, haproxy, nginx or a router policy (cache_aware), MODE how requests name their
// session (header, body, none), +events a router subscribed to the worker's KV-cache events.
type FrontSpec struct {
	Name        string
	Front       string
	SessionMode string
	Events      bool
	// Args are router flags (--flag=value) for a router front, given on its command line.
	Args []string
}

// router reports whether the front is a cacheroute router.
func (f *FrontSpec) router() bool {
	return f.Front != FrontDirect && f.Front != FrontNginx && f.Front != HAProxyPolicy
}

// ParseFronts reads a comma-separated list of FrontSpecs; entries without a mode take
// defaultMode. Names must be unique and exactly one entry must be direct.
func ParseFronts(list []string, defaultMode string) ([]FrontSpec, error) {
	var out []FrontSpec
	directs := 0
	err := namedEntries(list, "--fronts", "NAME=FRONT[:MODE][+events]", func(e, name, spec string) error {
		spec, events := strings.CutSuffix(spec, eventsSuffix)
		front, mode, hasMode := strings.Cut(spec, ":")
		if !hasMode {
			mode = defaultMode
		}
		f := FrontSpec{Name: name, Front: front, SessionMode: mode, Events: events}
		if _, ok := registry.Lookup(front); f.router() && !ok {
			return fmt.Errorf("--fronts: unknown front %q (want %s, %s, %s or a router policy: %s)", front, FrontDirect, HAProxyPolicy, FrontNginx, strings.Join(registry.Names(), ", "))
		}
		if !slices.Contains(SessionModes, mode) {
			return fmt.Errorf("--fronts %s: session id mode %q is not one of %s", e, mode, strings.Join(SessionModes, ", "))
		}
		if events && !f.router() {
			return fmt.Errorf("--fronts %s: %s is for routers, which subscribe to the worker's KV-cache events", e, eventsSuffix)
		}
		if front == HAProxyPolicy && mode == SessionBody {
			return fmt.Errorf("--fronts %s: HAProxy sticks on the x-session-id header, not on the body", e)
		}
		if front == FrontDirect {
			directs++
		}
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) > 0 && directs != 1 {
		return nil, fmt.Errorf("--fronts: give %s exactly once (got %d): every front's added time is paired with it", FrontDirect, directs)
	}
	return out, nil
}

// ApplyFrontRouterArgs hands each --router-arg to the router fronts it is for, as
// ApplyRouterArgs does for --policies entries (ARG for every router front, ENTRY=ARG for one),
// and checks every router front's flags before anything starts.
func ApplyFrontRouterArgs(fronts []FrontSpec, args []string) error {
	var specs []PolicySpec
	var index []int
	for i := range fronts {
		f := &fronts[i]
		policy := f.Front
		if !f.router() {
			policy = HAProxyPolicy // runs no router: the args refuse it by name
		}
		specs = append(specs, PolicySpec{Name: f.Name, Policy: policy, SessionMode: f.SessionMode})
		index = append(index, i)
	}
	if err := ApplyRouterArgs(specs, args); err != nil {
		return errors.New(strings.ReplaceAll(err.Error(), "--policies", "--fronts"))
	}
	for k, i := range index {
		fronts[i].Args = specs[k].Args
	}
	return nil
}

// FrontReport is what one front cost, against the same requests sent direct. Added times are
// wall clock, in milliseconds, whatever the workers' time scale.
type FrontReport struct {
	Name        string   `json:"name"`
	Front       string   `json:"front"` // direct, haproxy, nginx or the router's policy
	SessionMode string   `json:"session_id"`
	KVEvents    bool     `json:"kv_events,omitempty"`
	RouterArgs  []string `json:"router_args,omitempty"`
	Requests    int      `json:"requests"` // answered
	Errors      int      `json:"errors"`   // failed, and not sent after a failure
	// Paired is the requests answered both through the front and direct: the added times' sample.
	Paired int `json:"paired"`
	// AddedTTFT and AddedE2E are the percentiles of (request i through the front − request i
	// direct); nil for direct.
	AddedTTFT *Latency `json:"added_ttft_ms,omitempty"`
	AddedE2E  *Latency `json:"added_e2e_ms,omitempty"`
	// CPUSec is the front's processes' user and system time over its run (/proc/PID/stat), and
	// CPUPerRequestUS that time per request sent, in microseconds, read from the processes'
	// threads' run times (/proc/PID/task/*/schedstat, nanoseconds) when they could all be read,
	// else from /proc/PID/stat (10 ms ticks); nil for direct. StatCPUPerRequestUS is always
	// from /proc/PID/stat.
	CPUSec              float64  `json:"cpu_sec"`
	CPUPerRequestUS     *float64 `json:"cpu_us_per_request,omitempty"`
	StatCPUPerRequestUS *float64 `json:"stat_cpu_us_per_request,omitempty"`
	// IdleCPUPerSecUS is the CPU the front used while idle just before its run, in microseconds
	// per second (a router's health checks and /metrics scrapes), and NetCPUPerRequestUS
	// CPUPerRequestUS less that rate over the run's wall time, per request.
	IdleCPUPerSecUS    *float64 `json:"idle_cpu_us_per_sec,omitempty"`
	NetCPUPerRequestUS *float64 `json:"net_cpu_us_per_request,omitempty"`
	// Tokenize is the router's calls to the worker's /tokenize during the run, by result (ok,
	// cached, error, timeout: vllm_router_tokenize_requests_total); nil for other fronts.
	Tokenize map[string]float64 `json:"tokenize,omitempty"`
}

// PromptBytes describes the size of the requests' messages as JSON.
type PromptBytes struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	Max  float64 `json:"max"`
}

// runFronts runs the workload straight to one simulated worker and through each front.
func runFronts(ctx context.Context, o Options, rep *Report) error {
	if len(o.Policies) > 0 || len(o.Targets) > 0 || o.Replicas > 1 || o.PrefillWorkers > 0 || o.DecodeWorkers > 0 {
		return errors.New("--fronts runs alone: not with --policies, --target, --replicas or --prefill-workers")
	}
	simCfg := o.Sim
	// The front, not the worker's room, is measured: every request must fit the worker, and
	// every session's working set its KV cache at once, so that no session is evicted and no
	// router holds a session back for want of KV room.
	largest, sessions := o.Workload.workingSets()
	if need := largest + 64; need > simCfg.MaxModelLen {
		simCfg.MaxModelLen = need
	}
	if need := 2 * (sessions/max(1, simCfg.BlockSize) + 1); need > simCfg.KVCacheBlocks {
		simCfg.KVCacheBlocks = need
	}
	events := ""
	if slices.ContainsFunc(o.Fronts, func(f FrontSpec) bool { return f.Events }) {
		port, err := o.ports.consecutive(1)
		if err != nil {
			return fmt.Errorf("the worker's KV-cache events: %w", err)
		}
		events = "tcp://127.0.0.1:" + strconv.Itoa(port)
		simCfg.KVEvents = sim.KVEventsConfig{Endpoint: events, Bind: true}
	}
	fleet, err := o.ports.startSims(1, simCfg)
	if err != nil {
		return err
	}
	defer fleet.Close()
	model := o.Model
	if model == "" {
		model = simCfg.Models[0]
	}
	o.Sim, o.Workers = simCfg, 1
	if rep.Params == nil {
		rep.Params = map[string]any{}
	}
	rep.Params["kv_cache_blocks"], rep.Params["max_model_len"] = simCfg.KVCacheBlocks, simCfg.MaxModelLen
	rep.TimeScale = simCfg.TimeScale
	pb := o.Workload.promptBytes()
	rep.PromptBytes = &pb
	runs := make([]*frontRun, 0, len(o.Fronts))
	defer func() {
		for _, fr := range runs {
			fr.stop()
		}
	}()
	for _, f := range o.Fronts {
		fr, err := startFront(&o, f, fleet, events)
		if err != nil {
			return err
		}
		runs = append(runs, fr)
		if err := warmUp(ctx, &o, fr.target, model, fleet); err != nil {
			return fmt.Errorf("--fronts %s: %w", f.Name, err)
		}
	}
	if err := measureIdle(ctx, runs, o.idleWindow()); err != nil {
		return err
	}
	hc := newHTTPClient(1, 10*time.Second)
	defer hc.CloseIdleConnections()
	for _, fr := range runs {
		if fr.metrics != "" {
			if fr.tok0, err = tokenizeCounts(ctx, hc, fr.metrics); err != nil {
				return fmt.Errorf("--fronts %s: %w", fr.spec.Name, err)
			}
		}
	}
	rounds := splitRounds(&o.Workload, o.FrontRound)
	for k, r := range rounds {
		for _, fr := range runs {
			if err := resetFleet(ctx, fleet); err != nil {
				return err
			}
			label := fr.spec.Name
			if len(rounds) > 1 {
				label = fmt.Sprintf("%s (round %d of %d)", fr.spec.Name, k+1, len(rounds))
			}
			if err := fr.runRound(ctx, &o, &r, label, model); err != nil {
				return err
			}
		}
	}
	for _, fr := range runs {
		if err := fr.report(ctx, hc, rep); err != nil {
			return err
		}
	}
	base := slices.IndexFunc(o.Fronts, func(f FrontSpec) bool { return f.Front == FrontDirect })
	for i := range rep.Fronts {
		if i == base {
			continue
		}
		ttft, e2e := pairedDeltas(runs[base].records, runs[i].records)
		rep.Fronts[i].Paired = len(ttft)
		rep.Fronts[i].AddedTTFT, rep.Fronts[i].AddedE2E = latencyOf(ttft), latencyOf(e2e)
	}
	rep.Fronts[base].Paired = rep.Fronts[base].Requests
	return ctx.Err()
}

// frontRun is one front of a --fronts run, started, and what its rounds measured so far.
type frontRun struct {
	spec    FrontSpec
	target  *Target
	pids    func() []int // the processes whose CPU is the front's; none for direct
	metrics string       // a router's base URL, for its /metrics; "" for other fronts
	stop    func()
	tok0    map[string]float64 // the router's /tokenize counts before the first round

	records []Record // every round's, sessions numbered in the whole workload
	samples []loadSample
	wall    time.Duration
	skipped int
	run     cpuSpent // over the rounds
	idle    cpuSpent // over the idle window, idleFor long
	idleFor time.Duration
}

// cpuSpent is CPU time a front used: by /proc/PID/stat, and by its threads' schedstat when
// exact (every read had one).
type cpuSpent struct {
	stat, exact time.Duration
	inexact     bool
}

// add counts the CPU used between before and after.
func (c *cpuSpent) add(before, after cpuSnapshot) {
	stat, exact, hasExact := cpuUsed(before, after)
	c.stat += stat
	c.exact += exact
	c.inexact = c.inexact || !hasExact
}

// best is the exact figure when there is one, else the stat figure.
func (c *cpuSpent) best() time.Duration {
	if c.inexact {
		return c.stat
	}
	return c.exact
}

// startFront starts front f before fleet's worker (nothing for direct).
func startFront(o *Options, f FrontSpec, fleet *sim.Fleet, events string) (*frontRun, error) {
	worker := fleet.URLs()[0]
	fr := &frontRun{spec: f, pids: func() []int { return nil }, stop: func() {}}
	url := worker
	switch {
	case f.Front == FrontDirect:
	case f.Front == HAProxyPolicy:
		stick := ""
		if f.SessionMode == SessionHeader {
			stick = headerSessionID
		}
		px, err := haproxyproc.Start(haproxyproc.Config{Workers: []string{worker}, StickHeader: stick, Timeout: o.Timeout})
		if err != nil {
			return nil, fmt.Errorf("--fronts %s: %w", f.Name, err)
		}
		pid := px.PID()
		url, fr.pids, fr.stop = px.URL(), func() []int { return []int{pid} }, px.Close
	default:
		var p *frontProcess
		var err error
		if f.Front == FrontNginx {
			p, err = startNginx("--fronts "+f.Name, worker, o.Timeout, o.ports)
		} else {
			ev := ""
			if f.Events {
				ev = events
			}
			p, err = startRouterProcess(o.RouterCommand, "--fronts "+f.Name, worker, f.Front, ev, f.Args, o.ports)
		}
		if err != nil {
			return nil, err
		}
		url, fr.pids, fr.stop = p.url, p.pids, p.stop
		if f.router() {
			fr.metrics = p.url
		}
	}
	fr.target = &Target{Name: f.Name, URLs: []string{url}, SessionMode: f.SessionMode, Policy: f.Front, RouterArgs: f.Args,
		Loads: func() []float64 { return simLoads(fleet.Workers()) }, Workers: 1,
		TimeScale: o.Sim.TimeScale, KVCapacityTokens: o.kvCapacity()}
	return fr, nil
}

// measureIdle reads every front's CPU over one idle window, all fronts at once.
func measureIdle(ctx context.Context, runs []*frontRun, window time.Duration) error {
	before := make([]cpuSnapshot, len(runs))
	for i, fr := range runs {
		var err error
		if before[i], err = snapshotCPU(fr.pids()); err != nil {
			return fmt.Errorf("--fronts %s: %w", fr.spec.Name, err)
		}
	}
	if !sleepUntil(ctx, time.Now().Add(window)) {
		return ctx.Err()
	}
	for i, fr := range runs {
		after, err := snapshotCPU(fr.pids())
		if err != nil {
			return fmt.Errorf("--fronts %s: %w", fr.spec.Name, err)
		}
		fr.idle.add(before[i], after)
		fr.idleFor = window
	}
	return nil
}

// runRound sends round r through the front, its CPU read before and after.
func (fr *frontRun) runRound(ctx context.Context, o *Options, r *round, label, model string) error {
	cpu0, err := snapshotCPU(fr.pids())
	if err != nil {
		return fmt.Errorf("--fronts %s: %w", fr.spec.Name, err)
	}
	o.Progress.begin(label, r.w.Requests())
	res := run(ctx, &r.w, fr.target, RunOptions{API: o.API, Model: model, Concurrency: o.Concurrency, Timeout: o.Timeout, Progress: o.Progress})
	o.Progress.end()
	if res.failed != nil {
		return res.failed
	}
	cpu1, err := snapshotCPU(fr.pids())
	if err != nil {
		return fmt.Errorf("--fronts %s: %w", fr.spec.Name, err)
	}
	fr.run.add(cpu0, cpu1)
	for _, rec := range res.records {
		rec.Session += r.firstSession
		fr.records = append(fr.records, rec)
	}
	fr.samples = append(fr.samples, res.samples...)
	fr.wall += res.wall
	fr.skipped += res.skipped
	return ctx.Err()
}

// report adds the front's figures over every round to rep: its target report and its
// FrontReport, paired times aside.
func (fr *frontRun) report(ctx context.Context, hc *http.Client, rep *Report) error {
	tr := summarize(fr.target, runResult{records: fr.records, samples: fr.samples, wall: fr.wall, skipped: fr.skipped}, fr.target.TimeScale)
	rep.Targets = append(rep.Targets, tr)
	f := &fr.spec
	out := FrontReport{Name: f.Name, Front: f.Front, SessionMode: f.SessionMode, KVEvents: f.Events, RouterArgs: f.Args,
		Requests: tr.Requests, Errors: tr.Errors + tr.Skipped}
	if f.Front != FrontDirect {
		setCPU(&out, tr.Requests+tr.Errors, fr.run, fr.idle, fr.idleFor, fr.wall)
	}
	if fr.metrics != "" {
		tok1, err := tokenizeCounts(ctx, hc, fr.metrics)
		if err != nil {
			return fmt.Errorf("--fronts %s: %w", f.Name, err)
		}
		out.Tokenize = map[string]float64{}
		for _, r := range metrics.TokenizeResults {
			out.Tokenize[r] = tok1[r] - fr.tok0[r]
		}
	}
	rep.Fronts = append(rep.Fronts, out)
	return nil
}

// round is a part of the workload that every front takes in turn: whole sessions, the first of
// them the workload's session firstSession.
type round struct {
	w            Workload
	firstSession int
}

// splitRounds cuts w into rounds of consecutive whole sessions of at least size requests each
// (the last may be smaller); size 0 makes one round of everything.
func splitRounds(w *Workload, size int) []round {
	var out []round
	cur := round{w: Workload{Name: w.Name, Paced: w.Paced}}
	for i, s := range w.Sessions {
		if len(cur.w.Sessions) == 0 {
			cur.firstSession = i
		}
		cur.w.Sessions = append(cur.w.Sessions, s)
		if size > 0 && cur.w.Requests() >= size {
			out = append(out, cur)
			cur = round{w: Workload{Name: w.Name, Paced: w.Paced}}
		}
	}
	if len(cur.w.Sessions) > 0 {
		out = append(out, cur)
	}
	return out
}

// setCPU records in fr the CPU a front's processes used: over the idle window (idle long) as a
// rate, and over its rounds (wall long, sent requests), per request, whole and less what the
// idle rate would have used over the rounds.
func setCPU(fr *FrontReport, sent int, spent, idleSpent cpuSpent, idle, wall time.Duration) {
	fr.CPUSec = spent.stat.Seconds()
	if idle > 0 {
		rate := float64(idleSpent.best()) / float64(time.Microsecond) / idle.Seconds()
		fr.IdleCPUPerSecUS = &rate
	}
	if sent == 0 {
		return
	}
	per := func(d time.Duration) *float64 { v := float64(d) / float64(time.Microsecond) / float64(sent); return &v }
	fr.StatCPUPerRequestUS, fr.CPUPerRequestUS = per(spent.stat), per(spent.best())
	if fr.IdleCPUPerSecUS != nil {
		net := *fr.CPUPerRequestUS - *fr.IdleCPUPerSecUS*wall.Seconds()/float64(sent)
		fr.NetCPUPerRequestUS = &net
	}
}

// warmUpRequests is how many requests go through a front, unrecorded, before it is measured: its
// connections to the worker opened, the processes' code paths and buffers warm.
const warmUpRequests = 4

// warmUp sends the workload's first requests through t, then empties the worker's cache again,
// so that every front is measured warm, from the same cold cache.
func warmUp(ctx context.Context, o *Options, t *Target, model string, fleet *sim.Fleet) error {
	first := o.Workload.Sessions[0]
	first.Turns = first.Turns[:min(warmUpRequests, len(first.Turns))]
	w := Workload{Name: o.Workload.Name, Sessions: []Session{first}}
	res := run(ctx, &w, t, RunOptions{API: o.API, Model: model, Concurrency: 1, Timeout: o.Timeout})
	if res.failed != nil {
		return res.failed
	}
	for _, r := range res.records {
		if r.Err != "" {
			return fmt.Errorf("warming up: %s", r.Err)
		}
	}
	return resetFleet(ctx, fleet)
}

// idleWindow is how long a front's CPU is read idle before its run; 0 is defaultIdleWindow.
func (o *Options) idleWindow() time.Duration {
	if o.FrontIdle > 0 {
		return o.FrontIdle
	}
	return defaultIdleWindow
}

// defaultIdleWindow is long enough for a router's periodic work (health checks, /metrics
// scrapes every 100 ms) to show as a rate.
const defaultIdleWindow = 2 * time.Second

// metricTokenize is the router's counter of /tokenize calls, labelled by result.
const metricTokenize = "vllm_router_tokenize_requests_total"

// tokenizeCounts reads the router's /tokenize calls by result from its /metrics (served on its
// traffic port to loopback callers when no admin key is set).
func tokenizeCounts(ctx context.Context, client *http.Client, base string) (map[string]float64, error) {
	return scrapeWith(ctx, client, base, func(r io.Reader) (map[string]float64, error) { return sumByLabel(r, metricTokenize, "result") })
}

// pairedDeltas are, for every request answered both in base and in front (the same session and
// turn), its TTFT and E2E through front less base's, in milliseconds of wall clock.
func pairedDeltas(base, front []Record) (ttft, e2e []float64) {
	type key struct{ session, turn int }
	direct := make(map[key]*Record, len(base))
	for i := range base {
		if base[i].Err == "" {
			direct[key{base[i].Session, base[i].Turn}] = &base[i]
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for i := range front {
		r := &front[i]
		d, ok := direct[key{r.Session, r.Turn}]
		if r.Err != "" || !ok {
			continue
		}
		ttft = append(ttft, ms(r.TTFT-d.TTFT))
		e2e = append(e2e, ms(r.E2E-d.E2E))
	}
	return ttft, e2e
}

// latencyOf is the percentiles of xs; nil for none.
func latencyOf(xs []float64) *Latency {
	if len(xs) == 0 {
		return nil
	}
	slices.Sort(xs)
	return &Latency{P50: percentileSorted(xs, 50), P90: percentileSorted(xs, 90), P99: percentileSorted(xs, 99)}
}

// workingSets are the largest working set (prompt and output tokens) of any turn, and the sum
// over the sessions of each one's largest; both 0 when the workload does not know them.
func (w *Workload) workingSets() (largest, sessions int) {
	for i := range w.Sessions {
		own := 0
		for j := range w.Sessions[i].Turns {
			own = max(own, w.Sessions[i].Turns[j].Tokens)
		}
		largest = max(largest, own)
		sessions += own
	}
	return largest, sessions
}
