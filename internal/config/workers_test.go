package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// --worker-urls, --prefill and --decode give the static workers, each with its role, in order;
// the roles are accepted without any P/D mode switch.
func TestStaticWorkersCarryTheRoleOfTheirFlag(t *testing.T) {
	c := mustLoad(t, "--worker-urls", "http://127.0.0.1:8000", "--prefill", "http://127.0.0.1:8001,http://127.0.0.1:8002", "--decode", "http://127.0.0.1:8003")
	want := []config.StaticWorker{
		{URL: "http://127.0.0.1:8000", Role: workers.RoleColocated},
		{URL: "http://127.0.0.1:8001", Role: workers.RolePrefill},
		{URL: "http://127.0.0.1:8002", Role: workers.RolePrefill},
		{URL: "http://127.0.0.1:8003", Role: workers.RoleDecode},
	}
	if got := c.StaticWorkers(); !slices.Equal(got, want) {
		t.Fatalf("StaticWorkers() = %v, want %v", got, want)
	}
	if err := c.RequireWorkerSource(); err != nil {
		t.Fatalf("prefill and decode workers alone are a worker source: %v", err)
	}
}

// A URL in two roles is refused under the second flag, naming the URL (in any spelling) and the
// first flag.
func TestURLInTwoRolesIsRefused(t *testing.T) {
	c := config.Default()
	c.Prefill = []string{"http://127.0.0.1:8001"}
	c.Decode = []string{"http://127.0.0.1:8002", "http://127.0.0.1:8001/"}
	wantErrorNaming(t, c.Validate(), "a URL given as prefill and decode was accepted", "--decode", "http://127.0.0.1:8001", "--prefill")
}

// A role's selector alone is enough for --service-discovery; without discovery it is refused, and
// a malformed term is reported under its own flag.
func TestRoleSelectorsAreCheckedUnderTheirFlags(t *testing.T) {
	c := config.Default()
	c.ServiceDiscovery = true
	c.PrefillSelector = []string{"app=vllm", "role=prefill"}
	if err := c.Validate(); err != nil {
		t.Fatalf("--prefill-selector alone: %v", err)
	}
	if got := c.Selectors(); len(got) != 1 || got[0].Role != workers.RolePrefill || got[0].Selector != "app=vllm,role=prefill" {
		t.Fatalf("Selectors() = %v", got)
	}
	c.DecodeSelector = []string{"role"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--decode-selector") {
		t.Fatalf("a malformed decode selector: %v", err)
	}
	c.DecodeSelector, c.ServiceDiscovery = nil, false
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--prefill-selector: has no effect") {
		t.Fatalf("--prefill-selector without discovery: %v", err)
	}
}
