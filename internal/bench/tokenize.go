package bench

import (
	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/metrics"
)

// tokenize.go reads how often an entry's routers asked an engine for a request's prompt tokens
// (the /tokenize round trip that routing on KV-cache events costs), from their own
// vllm_router_tokenize_requests_total.

// tokenizeCalls sums, over the replicas, the calls to an engine's /tokenize (results ok, error
// and timeout, on a request's path or in the background) and the requests answered from the
// routers' token caches instead (cached: the prompt's own tokens; prefix: an earlier turn's).
func (rs replicaSet) tokenizeCalls() (calls, cached float64) {
	for _, lr := range rs {
		vec := lr.r.Metrics().TokenizeRequests
		for _, result := range metrics.TokenizeResults {
			var m dto.Metric
			if err := vec.WithLabelValues(result).Write(&m); err != nil {
				continue
			}
			switch result {
			case metrics.TokenizeCached, metrics.TokenizePrefix:
				cached += m.GetCounter().GetValue()
			case metrics.TokenizeOK, metrics.TokenizeError, metrics.TokenizeTimeout:
				calls += m.GetCounter().GetValue()
			}
		}
	}
	return calls, cached
}

// setTokenizeCalls records in tr the routers' tokenize calls per request sent, from the
// counters before (calls0, cached0) and after the run.
func setTokenizeCalls(tr *TargetReport, rs replicaSet, calls0, cached0 float64) {
	sent := float64(tr.Requests + tr.Errors)
	if sent == 0 {
		return
	}
	calls, cached := rs.tokenizeCalls()
	perReq, cachedPerReq := (calls-calls0)/sent, (cached-cached0)/sent
	tr.TokenizeCallsPerRequest, tr.TokenizeCachedPerRequest = &perReq, &cachedPerReq
}
