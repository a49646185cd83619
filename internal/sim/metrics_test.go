package sim

import (
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := do(t, h, "GET", "/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("/metrics status %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the single sample of a counter or gauge family, checking its
// type and the vLLM labels.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	if f.GetType() != typ {
		t.Fatalf("%s has type %v, want %v", name, f.GetType(), typ)
	}
	m := f.GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["model_name"] != "sim-model" || labels["engine"] != "0" {
		t.Fatalf("%s labels %v, want model_name=sim-model engine=0", name, labels)
	}
	switch typ {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

func TestMetrics_VLLMNamesTypesAndValues(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := []msg{{"user", words("m", 900)}}
	var prompts, cached, gen int
	for range 3 {
		r := chat(t, w, msgs, 7)
		prompts += r.Usage.PromptTokens
		cached += r.Usage.PromptTokensDetails.CachedTokens
		gen += r.Usage.CompletionTokens
	}
	fams := scrape(t, w)

	counters := map[string]int{
		"vllm:prefix_cache_queries_total": prompts,
		"vllm:prefix_cache_hits_total":    cached,
		"vllm:prompt_tokens_total":        prompts,
		"vllm:generation_tokens_total":    gen,
	}
	for name, want := range counters {
		if got := value(t, fams, name, dto.MetricType_COUNTER); got != float64(want) {
			t.Errorf("%s = %v, want %d", name, got, want)
		}
	}
	if cached == 0 {
		t.Fatal("repeated prompt never hit")
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		if got := value(t, fams, name, dto.MetricType_GAUGE); got != 0 {
			t.Errorf("%s = %v when idle, want 0", name, got)
		}
	}
	for _, name := range []string{"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"} {
		if got := value(t, fams, name, dto.MetricType_HISTOGRAM); got != 3 {
			t.Errorf("%s has %v samples, want 3", name, got)
		}
	}
	info := fams["vllm:cache_config_info"]
	if info == nil || info.GetType() != dto.MetricType_GAUGE || info.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatal("vllm:cache_config_info missing or not 1")
	}
	labels := map[string]string{}
	for _, l := range info.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["block_size"] != "16" || labels["num_gpu_blocks"] != "8192" {
		t.Fatalf("cache_config_info labels %v", labels)
	}
}

func TestMetrics_GaugesFollowLoad(t *testing.T) {
	cfg := DefaultConfig()
	clock := NewManualClock(time.Unix(0, 0))
	cfg.Clock = clock
	cfg.MaxNumSeqs = 1
	w := newWorker(t, cfg)
	done := make(chan struct{}, 2)
	for i := range 2 {
		go func() {
			chat(t, w, []msg{{"user", words(string(rune('x'+i)), 2000)}}, 1)
			done <- struct{}{}
		}()
	}
	testkit.WaitFor(t, "one running, one waiting", func() bool { s := w.Stats(); return s.Running == 1 && s.Waiting == 1 && clock.Sleepers() == 1 })
	fams := scrape(t, w)
	if v := value(t, fams, "vllm:num_requests_running", dto.MetricType_GAUGE); v != 1 {
		t.Errorf("running = %v, want 1", v)
	}
	if v := value(t, fams, "vllm:num_requests_waiting", dto.MetricType_GAUGE); v != 1 {
		t.Errorf("waiting = %v, want 1", v)
	}
	if v := value(t, fams, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE); v <= 0 || v > 1 {
		t.Errorf("kv_cache_usage_perc = %v, want in (0, 1] while a request holds blocks", v)
	}
	for range 2 {
		testkit.WaitFor(t, "a sleeper", func() bool { return clock.Sleepers() == 1 })
		clock.Advance(time.Hour)
		<-done
	}
}

func TestMetrics_RegistryPerWorker(t *testing.T) {
	a := newWorker(t, testConfig())
	b := newWorker(t, testConfig())
	chat(t, a, []msg{{"user", "only a"}}, 2)
	if v := value(t, scrape(t, b), "vllm:prompt_tokens_total", dto.MetricType_COUNTER); v != 0 {
		t.Fatalf("worker b counted %v prompt tokens of worker a", v)
	}
}
