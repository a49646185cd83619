// Package dashboard is the router's status page: one embedded HTML page that polls a JSON view
// of the fleet, the policy's state and a short history of the router's counters. It reads the
// pool and the metrics it is given and knows nothing of the proxy that serves it.
package dashboard

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

//go:embed page.html
var page []byte

// Samples is how many one-second snapshots of the counters are kept: five minutes.
const Samples = 300

// Options are what the page shows. Pool and Metrics are required; the rest may be nil.
type Options struct {
	Pool    *workers.Pool
	Metrics *metrics.Metrics
	Policy  string              // the policy's name
	State   metrics.PolicyState // sessions and tree size; nil when the policy keeps none
	// SessionStore reports the shared session store's state; nil without one. It is called with
	// detail false, so that the store's address never reaches the page.
	SessionStore func(ctx context.Context, detail bool) any
	// Queue reports admitted requests in flight and requests waiting; nil without admission
	// control.
	Queue func() (inFlight, queued int)
	// KVEvents reports the workers' KV-cache event streams; nil without --kv-events-endpoint.
	KVEvents func() []kvevents.Status
}

// Dashboard serves the page and its data and keeps the counters' recent history.
type Dashboard struct {
	opts  Options
	clock func() time.Time

	mu    sync.Mutex
	ring  [Samples]sample
	next  int // where the next sample goes
	count int // samples held, at most Samples
}

// sample is one reading of the router's cumulative counters.
type sample struct {
	at          time.Time
	requests    float64            // every answered request
	errors      float64            // 5xx and cut answers
	decisions   map[string]float64 // by decision label (cache_aware) or by worker (other policies)
	tokens      map[string]tokens  // by worker, summed over decision labels
	corrections map[string]float64 // by worker
}

// tokens are a worker's prompt-token counters: the prompt tokens of the answers that reported
// what they served from cache, how many of them the policy predicted cached, and how many the
// worker said it served from cache.
type tokens struct{ prompt, predicted, achieved float64 }

// New returns a dashboard over opts.
func New(opts Options) *Dashboard { return &Dashboard{opts: opts, clock: time.Now} }

// Run takes a sample every second until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	d.Sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.Sample()
		}
	}
}

// Sample reads the counters now and adds the reading to the history, dropping the oldest once
// the history is full.
func (d *Dashboard) Sample() {
	s := sample{at: d.clock(), decisions: map[string]float64{}, tokens: map[string]tokens{}, corrections: map[string]float64{}}
	m := d.opts.Metrics
	each(m.Requests, func(labels map[string]string, v float64) {
		s.requests += v
		if c := labels["status_class"]; c == "5xx" || c == "cut" {
			s.errors += v
		}
	})
	each(m.CacheAwareDecisions, func(labels map[string]string, v float64) { s.decisions[labels["decision"]] += v })
	if len(s.decisions) == 0 {
		each(m.PolicyDecisions, func(labels map[string]string, v float64) { s.decisions[labels["worker"]] += v })
	}
	// Only workers with answers appear here, so a sample's size follows the fleet that served.
	addTokens := func(vec *prometheus.CounterVec, field func(*tokens) *float64) {
		each(vec, func(labels map[string]string, v float64) {
			t := s.tokens[labels["worker"]]
			*field(&t) += v
			s.tokens[labels["worker"]] = t
		})
	}
	addTokens(m.PromptTokens, func(t *tokens) *float64 { return &t.prompt })
	addTokens(m.CachedTokensPredicted, func(t *tokens) *float64 { return &t.predicted })
	addTokens(m.CachedTokensAchieved, func(t *tokens) *float64 { return &t.achieved })
	each(m.CacheCorrections, func(labels map[string]string, v float64) { s.corrections[labels["worker"]] += v })
	d.mu.Lock()
	d.ring[d.next] = s
	d.next = (d.next + 1) % Samples
	d.count = min(d.count+1, Samples)
	d.mu.Unlock()
}

// each calls f with the labels and value of every counter of vec.
func each(vec *prometheus.CounterVec, f func(labels map[string]string, v float64)) {
	ch := make(chan prometheus.Metric, 64)
	go func() { vec.Collect(ch); close(ch) }()
	for metric := range ch {
		var out dto.Metric
		if metric.Write(&out) != nil || out.Counter == nil {
			continue
		}
		labels := make(map[string]string, len(out.Label))
		for _, l := range out.Label {
			labels[l.GetName()] = l.GetValue()
		}
		f(labels, out.Counter.GetValue())
	}
}

// ServeHTTP answers GET /dashboard (the page) and GET /dashboard/data (its JSON). The caller
// guards both: the page shows the fleet's topology.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.URL.Path == "/dashboard/data" {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.Data(r.Context()))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// The page loads nothing from anywhere: its script and style are inline.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'")
	_, _ = w.Write(page)
}

// Data is the JSON the page polls.
type Data struct {
	Time   time.Time `json:"time"`
	Policy string    `json:"policy"`
	// LoadSignal is what each worker's load is (requests, tokens or engine; see
	// docs/load-signals.md).
	LoadSignal string `json:"load_signal"`
	// RecentSeconds is the span of the history: the window of the workers' recent hit rates.
	RecentSeconds int            `json:"recent_seconds"`
	Workers       []Worker       `json:"workers"`
	Models        []Model        `json:"models"`
	TreeBytes     *int           `json:"tree_bytes,omitempty"`
	TreeChars     *int           `json:"tree_chars,omitempty"`
	Decisions     map[string]int `json:"decisions"` // since the router started
	Requests      int            `json:"requests"`  // since the router started
	History       []Second       `json:"history"`   // oldest first
	SessionStore  any            `json:"session_store,omitempty"`
	Admission     *Admission     `json:"admission,omitempty"`
}

// Worker is one tenant, by its redacted name only.
type Worker struct {
	Name    string   `json:"name"`
	DPRank  *int     `json:"dp_rank,omitempty"`
	Role    string   `json:"role"` // colocated, prefill or decode
	Models  []string `json:"models"`
	Healthy bool     `json:"healthy"`
	Breaker string   `json:"circuit_breaker"`
	// Load is the value of the pool's load signal, the figure the policies balance on; InFlight
	// is this router's own count of requests on the worker, whatever the signal.
	Load     int64 `json:"load"`
	InFlight int64 `json:"in_flight"`
	// Engine is the worker's own figures at its last scrape that found them; Scrape is the
	// scrapes' state. Both are absent unless the workers' /metrics are scraped (load signal
	// engine) and there is something to show.
	Engine        *Engine   `json:"engine,omitempty"`
	Scrape        *Scrape   `json:"scrape,omitempty"`
	Cache         CacheHits `json:"cache"`
	KVEvents      *KVEvents `json:"kv_events,omitempty"`
	ProbeError    string    `json:"last_probe_error,omitempty"`
	ProbeFailures int       `json:"consecutive_probe_failures,omitempty"`
}

// Engine is what a worker's /metrics said at its last successful scrape.
type Engine struct {
	Running float64 `json:"running"`
	Waiting float64 `json:"waiting"`
	// KVCacheUsage is the fraction of the KV cache in use, 0..1; absent when the worker does not
	// export it.
	KVCacheUsage *float64 `json:"kv_cache_usage,omitempty"`
	// Fresh is whether the figures are recent enough to route on; when they are not, the engine
	// signal falls back to this router's in-flight count.
	Fresh bool `json:"fresh"`
}

// KVEvents is the state of a worker's KV-cache event stream and of its block index.
type KVEvents struct {
	// Complete is whether the index has every batch since the worker's publisher's first; an
	// incomplete one still never credits a block the engine dropped.
	Complete bool  `json:"complete"`
	Blocks   int   `json:"blocks"`
	Batches  int64 `json:"batches"`
	Gaps     int64 `json:"gaps"`
	Resyncs  int64 `json:"resyncs"`
	// AgeSeconds is the time since the last batch; absent before the first.
	AgeSeconds *float64 `json:"age_seconds,omitempty"`
}

// Scrape is the state of the scrapes of a worker's /metrics.
type Scrape struct {
	// AgeSeconds is the time since the last successful scrape began; absent before the first.
	AgeSeconds *float64 `json:"age_seconds,omitempty"`
	Errors     int64    `json:"errors"` // failed scrapes since the router started
}

// CacheHits compares, for one worker, the prompt tokens the policy predicted the worker's prefix
// cache held with those the worker reported it served from cache, over the answers that reported
// their cached tokens, all decision labels together. A rate is the cached tokens divided by the
// prompt tokens; it is null (the page shows n/a) when there are no such answers. The Recent rates
// cover the history's span (Data.RecentSeconds) and are null until it holds two samples.
type CacheHits struct {
	PromptTokens    float64  `json:"prompt_tokens"`    // since the router started
	PredictedTokens float64  `json:"predicted_tokens"` // since the router started
	AchievedTokens  float64  `json:"achieved_tokens"`  // since the router started
	Predicted       *float64 `json:"predicted_hit_rate"`
	Achieved        *float64 `json:"achieved_hit_rate"`
	RecentPredicted *float64 `json:"recent_predicted_hit_rate"`
	RecentAchieved  *float64 `json:"recent_achieved_hit_rate"`
	// Corrections counts the answers that reported far fewer cached tokens than predicted, so
	// that the policy stopped counting on what the worker had evicted.
	Corrections int `json:"corrections"`
}

// Model is the affinity state the policy keeps for one model.
type Model struct {
	Name     string `json:"name"`
	Sessions int    `json:"sessions"`
}

// Second is what changed over one second of the history.
type Second struct {
	Time      int64          `json:"t"` // Unix seconds
	Requests  float64        `json:"requests"`
	Errors    float64        `json:"errors"`
	Decisions map[string]int `json:"decisions"`
}

// Admission is the admission queue's state.
type Admission struct {
	InFlight int `json:"in_flight"`
	Queued   int `json:"queued"`
}

// Data returns the page's data now. The counters are those of the last sample, at most a second
// old; the workers' state is read now.
func (d *Dashboard) Data(ctx context.Context) Data {
	pool := d.opts.Pool
	out := Data{Time: d.clock().UTC(), Policy: d.opts.Policy, LoadSignal: pool.LoadSignal(), Workers: []Worker{},
		Models: []Model{}, Decisions: map[string]int{}, History: d.history()}

	// A sample's maps are never written once it is in the ring, so they are read unlocked.
	var first, last sample
	d.mu.Lock()
	if d.count > 0 {
		first, last = d.ring[(d.next+Samples-d.count)%Samples], d.ring[(d.next+Samples-1)%Samples]
	}
	recent := d.count > 1
	d.mu.Unlock()
	if recent {
		out.RecentSeconds = int(last.at.Sub(first.at).Round(time.Second) / time.Second)
	}
	out.Requests = int(last.requests)
	for k, v := range last.decisions {
		out.Decisions[k] = int(v)
	}

	scraped := out.LoadSignal == workers.SignalEngine
	streams := map[tenant.ID]kvevents.Status{}
	if d.opts.KVEvents != nil {
		for _, st := range d.opts.KVEvents() {
			streams[st.Worker] = st
		}
	}
	for _, w := range pool.All() {
		info := Worker{Name: w.Name(), Role: w.Role().String(), Models: w.Models(), Healthy: w.Healthy(), Breaker: w.Breaker().State().String(),
			Load: w.Load(), InFlight: w.InFlight()}
		if rank := w.Rank(); rank >= 0 {
			info.DPRank = &rank
		}
		if st, ok := w.Probe(); ok && st.Failures > 0 {
			info.ProbeError, info.ProbeFailures = st.LastError, st.Failures
		}
		if stats, fresh, ok := w.Engine(); ok {
			info.Engine = &Engine{Running: stats.Running, Waiting: stats.Waiting, Fresh: fresh}
			if stats.HasKVCacheUsage {
				usage := stats.KVCacheUsage
				info.Engine.KVCacheUsage = &usage
			}
		}
		at, scrapedOnce := w.LastScrape()
		if errs := w.ScrapeErrors(); scraped || scrapedOnce || errs > 0 {
			info.Scrape = &Scrape{Errors: errs}
			if scrapedOnce {
				// LastScrape carries a monotonic reading, so the age survives wall-clock steps.
				age := max(time.Since(at), 0).Round(time.Millisecond).Seconds()
				info.Scrape.AgeSeconds = &age
			}
		}
		if st, ok := streams[w.ID()]; ok {
			info.KVEvents = &KVEvents{Complete: st.Complete, Blocks: st.Blocks, Batches: st.Batches, Gaps: st.Gaps, Resyncs: st.Resyncs}
			if !st.LastEvent.IsZero() {
				age := max(time.Since(st.LastEvent), 0).Round(time.Millisecond).Seconds()
				info.KVEvents.AgeSeconds = &age
			}
		}
		now := last.tokens[w.Name()]
		info.Cache = CacheHits{PromptTokens: now.prompt, PredictedTokens: now.predicted, AchievedTokens: now.achieved,
			Predicted: rate(now.predicted, now.prompt), Achieved: rate(now.achieved, now.prompt),
			Corrections: int(last.corrections[w.Name()])}
		if recent {
			then := first.tokens[w.Name()]
			prompt := now.prompt - then.prompt
			info.Cache.RecentPredicted = rate(now.predicted-then.predicted, prompt)
			info.Cache.RecentAchieved = rate(now.achieved-then.achieved, prompt)
		}
		out.Workers = append(out.Workers, info)
	}
	if st := d.opts.State; st != nil {
		bytes, chars := st.TreeBytes(), st.TreeChars()
		out.TreeBytes, out.TreeChars = &bytes, &chars
		for model, n := range st.Sessions() {
			out.Models = append(out.Models, Model{Name: model, Sessions: n})
		}
		sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Name < out.Models[j].Name })
	}
	if d.opts.SessionStore != nil {
		out.SessionStore = d.opts.SessionStore(ctx, false)
	}
	if d.opts.Queue != nil {
		in, queued := d.opts.Queue()
		out.Admission = &Admission{InFlight: in, Queued: queued}
	}
	return out
}

// rate is cached/prompt, clamped to 0..1, or nil when there are no prompt tokens (a worker that
// answered nothing in the window, or whose counters were reset by its removal).
func rate(cached, prompt float64) *float64 {
	if prompt <= 0 {
		return nil
	}
	r := min(max(cached/prompt, 0), 1)
	return &r
}

// history returns the per-second changes between consecutive samples, oldest first.
func (d *Dashboard) history() []Second {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Second, 0, max(d.count-1, 0))
	first := (d.next + Samples - d.count) % Samples
	for i := 1; i < d.count; i++ {
		prev, cur := d.ring[(first+i-1)%Samples], d.ring[(first+i)%Samples]
		s := Second{Time: cur.at.Unix(), Requests: max(cur.requests-prev.requests, 0), Errors: max(cur.errors-prev.errors, 0), Decisions: map[string]int{}}
		for k, v := range cur.decisions {
			if n := int(v - prev.decisions[k]); n > 0 {
				s.Decisions[k] = n
			}
		}
		out = append(out, s)
	}
	return out
}
