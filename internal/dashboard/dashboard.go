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

	"github.com/cacheroute/cacheroute/internal/metrics"
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
	at        time.Time
	requests  float64            // every answered request
	errors    float64            // 5xx and cut answers
	decisions map[string]float64 // by decision label (cache_aware) or by worker (other policies)
}

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
	s := sample{at: d.clock(), decisions: map[string]float64{}}
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
	Time         time.Time      `json:"time"`
	Policy       string         `json:"policy"`
	Workers      []Worker       `json:"workers"`
	Models       []Model        `json:"models"`
	TreeBytes    *int           `json:"tree_bytes,omitempty"`
	TreeChars    *int           `json:"tree_chars,omitempty"`
	Decisions    map[string]int `json:"decisions"` // since the router started
	Requests     int            `json:"requests"`  // since the router started
	History      []Second       `json:"history"`   // oldest first
	SessionStore any            `json:"session_store,omitempty"`
	Admission    *Admission     `json:"admission,omitempty"`
}

// Worker is one tenant, by its redacted name only.
type Worker struct {
	Name          string   `json:"name"`
	DPRank        *int     `json:"dp_rank,omitempty"`
	Models        []string `json:"models"`
	Healthy       bool     `json:"healthy"`
	Breaker       string   `json:"circuit_breaker"`
	Load          int64    `json:"load"`
	ProbeError    string   `json:"last_probe_error,omitempty"`
	ProbeFailures int      `json:"consecutive_probe_failures,omitempty"`
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

// Data returns the page's data now.
func (d *Dashboard) Data(ctx context.Context) Data {
	out := Data{Time: d.clock().UTC(), Policy: d.opts.Policy, Workers: []Worker{}, Models: []Model{}, Decisions: map[string]int{}, History: d.history()}
	for _, w := range d.opts.Pool.All() {
		info := Worker{Name: w.Name(), Models: w.Models(), Healthy: w.Healthy(), Breaker: w.Breaker().State().String(), Load: w.Load()}
		if rank := w.Rank(); rank >= 0 {
			info.DPRank = &rank
		}
		if st, ok := w.Probe(); ok && st.Failures > 0 {
			info.ProbeError, info.ProbeFailures = st.LastError, st.Failures
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
	d.mu.Lock()
	if d.count > 0 {
		last := d.ring[(d.next+Samples-1)%Samples]
		out.Requests = int(last.requests)
		for k, v := range last.decisions {
			out.Decisions[k] = int(v)
		}
	}
	d.mu.Unlock()
	if d.opts.SessionStore != nil {
		out.SessionStore = d.opts.SessionStore(ctx, false)
	}
	if d.opts.Queue != nil {
		in, queued := d.opts.Queue()
		out.Admission = &Admission{InFlight: in, Queued: queued}
	}
	return out
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
