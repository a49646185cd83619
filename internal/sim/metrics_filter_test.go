package sim

import (
	"strings"
	"testing"
)

// A scraper that names families with name[] (as the router's engine load signal does) gets only
// those, as from vLLM's prometheus_client; without name[] the whole page comes back.
func TestMetricsHonourTheNameFilter(t *testing.T) {
	w := newWorker(t, testConfig())
	rec := do(t, w, "GET", "/metrics?name%5B%5D=vllm%3Anum_requests_running&name%5B%5D=vllm%3Anum_requests_waiting&name%5B%5D=sglang%3Anum_running_reqs", "")
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	fams := map[string]bool{}
	for line := range strings.Lines(rec.Body.String()) {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			fams[strings.Fields(name)[0]] = true
		}
	}
	if len(fams) != 2 || !fams["vllm:num_requests_running"] || !fams["vllm:num_requests_waiting"] {
		t.Fatalf("families %v, want only vllm:num_requests_running and vllm:num_requests_waiting", fams)
	}
	whole := scrape(t, w)
	if _, ok := whole["vllm:kv_cache_usage_perc"]; !ok || len(whole) <= 2 {
		t.Fatalf("unfiltered page has %d families, want them all", len(whole))
	}
}
