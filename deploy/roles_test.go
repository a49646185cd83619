package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// The chart's per-role selectors reach the router's config as --prefill-selector and
// --decode-selector; with them the colocated selector may be null, and the config validates.
func TestChartRoleSelectors(t *testing.T) {
	r := renderChart(t, nil, "discovery.selector=null",
		"discovery.prefillSelector={app=vllm,role=prefill}", "discovery.decodeSelector={app=vllm,role=decode}")
	dep := one[*appsv1.Deployment](r)
	cfg := routerConfig(t, r, dep)
	if !cfg.ServiceDiscovery || len(cfg.Selector) != 0 ||
		!slices.Equal(cfg.PrefillSelector, []string{"app=vllm", "role=prefill"}) ||
		!slices.Equal(cfg.DecodeSelector, []string{"app=vllm", "role=decode"}) {
		t.Fatalf("selector %q, prefill %q, decode %q", cfg.Selector, cfg.PrefillSelector, cfg.DecodeSelector)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the rendered config does not validate: %v", err)
	}
}
