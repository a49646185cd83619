package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/workers"
)

const (
	dashboardFile = "grafana/cacheroute.json"
	rulesFile     = "prometheus/cacheroute-rules.yaml"
)

// targetLabels are the labels Prometheus adds to every scraped series (job, instance) and those a
// ServiceMonitor or Kubernetes service discovery commonly adds.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// exported is the set of series names the router exports, each with the labels it may carry.
type exported map[string][]string

// routerSeries lists every series name the router exports: the names registered by
// internal/metrics.New (described, so that vectors with no series yet count too), with a
// histogram's _bucket (with le), _sum and _count and a summary's _sum and _count (and quantile).
func routerSeries(t *testing.T) exported {
	t.Helper()
	m := metrics.New(workers.NewPool(workers.Options{}))

	// Kinds: the exported fields' collectors, and whatever the registry gathers (the Go and
	// process collectors, and series that exist before any request).
	kinds := map[string]dto.MetricType{}
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		kind := dto.MetricType_UNTYPED
		switch v.Field(i).Interface().(type) {
		case prometheus.Histogram, *prometheus.HistogramVec:
			kind = dto.MetricType_HISTOGRAM
		case prometheus.Summary, *prometheus.SummaryVec:
			kind = dto.MetricType_SUMMARY
		}
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		for _, d := range describe(c) {
			kinds[d.name] = kind
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		kinds[f.GetName()] = f.GetType()
	}

	out := exported{}
	for _, d := range describe(m.Registry) {
		labels := append(slices.Clone(d.labels), targetLabels...)
		switch kinds[d.name] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			out[d.name+"_bucket"] = append(slices.Clone(labels), "le")
			out[d.name+"_sum"] = labels
			out[d.name+"_count"] = labels
		case dto.MetricType_SUMMARY:
			out[d.name] = append(slices.Clone(labels), "quantile")
			out[d.name+"_sum"] = labels
			out[d.name+"_count"] = labels
		default:
			out[d.name] = labels
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d series names found: %v", len(out), out)
	}
	return out
}

type desc struct {
	name   string
	labels []string
}

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

// describe lists the metric names and variable labels a collector describes.
func describe(c prometheus.Collector) []desc {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var out []desc
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			panic("cannot read " + d.String())
		}
		var labels []string
		for l := range strings.SplitSeq(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				labels = append(labels, l)
			}
		}
		out = append(out, desc{m[1], labels})
	}
	return out
}

func TestRouterSeriesIncludeHistogramParts(t *testing.T) {
	series := routerSeries(t)
	for _, name := range []string{
		"vllm_router_requests_total", "vllm_router_active_workers", "vllm_router_worker_load",
		"vllm_router_time_to_first_byte_seconds_bucket", "vllm_router_cache_aware_prefix_match_ratio_count",
		"vllm_router_cache_aware_sessions", "process_cpu_seconds_total",
	} {
		if _, ok := series[name]; !ok {
			t.Errorf("%s missing from the exported series", name)
		}
	}
	if _, ok := series["vllm_router_time_to_first_byte_seconds"]; ok {
		t.Error("a histogram's own name is no series")
	}
	if !slices.Contains(series["vllm_router_worker_load"], "worker") {
		t.Errorf("vllm_router_worker_load labels %v, want worker", series["vllm_router_worker_load"])
	}
}

// checkExpr checks that every metric an expression names is exported, that every matcher uses a
// label the metric carries, and that every grouping label is carried by a metric the expression
// names.
func checkExpr(series exported, expr string) []error {
	refs, err := parsePromQL(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	carried := map[string]bool{}
	for _, s := range refs.Selectors {
		if s.Metric == "" {
			errs = append(errs, fmt.Errorf("a selector without a metric name"))
			continue
		}
		labels, ok := series[s.Metric]
		if !ok {
			errs = append(errs, fmt.Errorf("%s is not exported by the router", s.Metric))
			continue
		}
		for _, l := range labels {
			carried[l] = true
		}
		for _, l := range s.Labels {
			if !slices.Contains(labels, l) {
				errs = append(errs, fmt.Errorf("%s has no label %q (it has %v)", s.Metric, l, labels))
			}
		}
	}
	if len(refs.Selectors) == 0 {
		errs = append(errs, fmt.Errorf("names no metric"))
	}
	for _, l := range refs.Grouping {
		if !carried[l] {
			errs = append(errs, fmt.Errorf("groups by %q, which none of its metrics carries", l))
		}
	}
	return errs
}

func TestCheckExprFindsMistakes(t *testing.T) {
	series := exported{"a_total": {"worker", "job"}, "h_bucket": {"le", "job"}}
	for expr, ok := range map[string]bool{
		`sum by (worker) (rate(a_total{job="x"}[5m]))`:    true,
		`histogram_quantile(0.9, sum by (le) (h_bucket))`: true,
		`rate(a_totl[5m])`:                                    false,
		`sum by (model) (rate(a_total[5m]))`:                  false,
		`rate(a_total{model="m"}[5m])`:                        false,
		`histogram_quantile(0.9, sum by (le) (a_total))`:      false,
		`sum(rate(a_total[5m])) / sum(rate(b_total[5m]))`:     false,
		`count({job="x"})`:                                    false,
		`sum without (worker) (a_total) and on (job) a_total`: true,
	} {
		if errs := checkExpr(series, expr); (len(errs) == 0) != ok {
			t.Errorf("%s: errors %v, want ok=%v", expr, errs, ok)
		}
	}
}

// grafanaPanel is the part of a Grafana panel the test reads.
type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDashboard struct {
	UID        string         `json:"uid"`
	Title      string         `json:"title"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// dashboardQueries returns every PromQL query of the dashboard by where it is, the templating
// queries' label_values(expr, label) given as expr.
func dashboardQueries(t *testing.T, d grafanaDashboard) map[string]string {
	t.Helper()
	queries := map[string]string{}
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			for _, tg := range p.Targets {
				queries[fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Query
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		s, _ := q.(string)
		m := labelValues.FindStringSubmatch(strings.TrimSpace(s))
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, s)
			continue
		}
		// The label listed must be one the metric carries: sum by (label) (metric) says so.
		queries["variable "+v.Name] = fmt.Sprintf("sum by (%s) (%s)", m[2], m[1])
	}
	return queries
}

func TestDashboardUsesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title, so that re-importing it replaces it")
	}
	series := routerSeries(t)
	queries := dashboardQueries(t, d)
	used := map[string]bool{}
	for where, expr := range queries {
		for _, err := range checkExpr(series, expr) {
			t.Errorf("%s: %s: %v", dashboardFile, where, err)
		}
		refs, _ := parsePromQL(expr)
		for _, s := range refs.Selectors {
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s.Metric, "_bucket"), "_sum"), "_count")] = true
		}
	}

	// What the dashboard is for: request rate and errors, decision mix, predicted prefix match,
	// in-flight load and load signal, the engine scrape, predicted and achieved cache hits, latency
	// percentiles, session store health, the admission queue.
	for _, name := range []string{
		"vllm_router_requests_total", "vllm_router_upstream_errors_total", "vllm_router_processed_requests_total",
		"vllm_router_cache_aware_decisions_total", "vllm_router_cache_aware_prefix_match_ratio",
		"vllm_router_worker_load", "vllm_router_worker_healthy", "vllm_router_active_workers",
		"vllm_router_worker_load_signal", "vllm_router_worker_kv_cache_usage_ratio",
		"vllm_router_worker_metrics_age_seconds", "vllm_router_worker_metrics_scrape_errors_total",
		"vllm_router_prompt_tokens_total", "vllm_router_cached_tokens_predicted_total",
		"vllm_router_cached_tokens_achieved_total", "vllm_router_cache_aware_corrections_total",
		"vllm_router_time_to_first_byte_seconds", "vllm_router_request_duration_seconds",
		"vllm_router_session_store_requests_total", "vllm_router_session_store_errors_total",
		"vllm_router_session_store_latency_seconds", "vllm_router_admission_queue_length",
		"vllm_router_admission_rejections_total",
	} {
		if !used[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}

	// Panels: unique ids, a place on the grid, and the data source variable, so that the
	// dashboard imports into any Grafana.
	ids := map[int]string{}
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			if prev, ok := ids[p.ID]; ok || p.ID == 0 {
				t.Errorf("panel %q: id %d already used by %q", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
			}
			if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0) {
				t.Errorf("panel %q: want targets on the ${datasource} variable", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
}

// The structure of a Prometheus rule file (prometheus/model/rulefmt), decoded strictly.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval,omitempty"`
		Limit    int    `yaml:"limit,omitempty"`
		Rules    []struct {
			Record        string            `yaml:"record,omitempty"`
			Alert         string            `yaml:"alert,omitempty"`
			Expr          string            `yaml:"expr"`
			For           string            `yaml:"for,omitempty"`
			KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
			Labels        map[string]string `yaml:"labels,omitempty"`
			Annotations   map[string]string `yaml:"annotations,omitempty"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	series := routerSeries(t)
	// Names recorded by the file's own recording rules may be used by its other rules.
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				series[r.Record] = targetLabels
			}
		}
	}
	alerts := map[string]bool{}
	groups := map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q empty or repeated", g.Name)
		}
		groups[g.Name] = true
		for _, d := range []string{g.Interval} {
			if d != "" {
				if _, err := model.ParseDuration(d); err != nil {
					t.Errorf("group %s interval: %v", g.Name, err)
				}
			}
		}
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("rule %q: want exactly one of alert and record", name)
			}
			if r.Record != "" && !model.IsValidMetricName(model.LabelValue(r.Record)) {
				t.Errorf("record %q is not a metric name", r.Record)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if d != "" {
					if _, err := model.ParseDuration(d); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}
			}
			for _, err := range checkExpr(series, r.Expr) {
				t.Errorf("%s: %s: %v", rulesFile, name, err)
			}
			if r.Alert == "" {
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			alerts[r.Alert] = true
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a summary and a description", r.Alert)
			}
			for k := range r.Labels {
				if !model.LabelName(k).IsValid() {
					t.Errorf("%s: label %q", r.Alert, k)
				}
			}
		}
	}
	for _, want := range []string{
		"CacheRouteAllWorkersDown", "CacheRouteCircuitBreakerOpen", "CacheRouteSessionStoreUnreachable",
		"CacheRouteFallbackDecisionsDominate", "CacheRouteLoadImbalance", "CacheRouteWorkerMetricsStale",
		"CacheRoutePredictionDrift",
	} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
	if t.Failed() {
		names := make([]string, 0, len(alerts))
		for a := range alerts {
			names = append(names, a)
		}
		sort.Strings(names)
		t.Logf("alerts defined: %v", names)
	}
}
