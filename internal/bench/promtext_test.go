package bench

import (
	"strings"
	"testing"
)

func TestSumMetricsAddsEveryLabelSet(t *testing.T) {
	text := `# HELP vllm:prefix_cache_hits_total Prefix cache hits.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="a"} 1200
vllm:prefix_cache_hits_total{engine="1",model_name="a {x}"} 34
vllm:prefix_cache_queries_total 5000 1712345678
vllm:prefix_cache_queries_total_extra 7
vllm:num_requests_running{engine="0"} 3
`
	got, err := sumMetrics(strings.NewReader(text), metricPrefixHits, metricPrefixQueries, metricWaiting)
	if err != nil {
		t.Fatal(err)
	}
	if got[metricPrefixHits] != 1234 || got[metricPrefixQueries] != 5000 || len(got) != 2 {
		t.Fatalf("got %v", got)
	}
	if _, err := sumMetrics(strings.NewReader("vllm:prefix_cache_hits_total x\n"), metricPrefixHits); err == nil {
		t.Fatal("bad value accepted")
	}
}
