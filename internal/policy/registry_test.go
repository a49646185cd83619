package policy_test

import (
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	_ "github.com/cacheroute/cacheroute/internal/policy/cacheaware" // registers cache_aware
	"github.com/cacheroute/cacheroute/internal/policy/registry"
)

func TestNewBuildsEveryListedPolicyUnderItsName(t *testing.T) {
	names := registry.Names()
	if names[0] != "cache_aware" {
		t.Errorf("the default policy is listed first; got %q", names[0])
	}
	for _, name := range names {
		p, err := policy.New(name, policy.Env{}, nil)
		if err != nil {
			t.Errorf("New(%q): %v", name, err)
			continue
		}
		if p.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, p.Name())
		}
		if e, _ := registry.Lookup(name); e.Summary == "" {
			t.Errorf("%s has no summary for the help text", name)
		}
	}
	for _, want := range []string{"cache_aware", "random", "round_robin", "power_of_two", "consistent_hash", "rendezvous_hash"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not registered", want)
		}
	}
}

func TestNewRejectsUnknownNames(t *testing.T) {
	for _, name := range []string{"", "least_loaded", "RANDOM", "cache-aware"} {
		if _, err := policy.New(name, policy.Env{}, nil); err == nil {
			t.Errorf("New(%q) succeeded", name)
		}
	}
}

func TestTwoRoundRobinsKeepCountersOfTheirOwn(t *testing.T) {
	a, _ := policy.New("round_robin", policy.Env{}, nil)
	b, _ := policy.New("round_robin", policy.Env{}, nil)
	if a == b {
		t.Error("two round_robin policies share their state")
	}
}

func TestOnlyCacheAwareLabelsBeyondItsName(t *testing.T) {
	for _, name := range registry.Names() {
		p, _ := policy.New(name, policy.Env{}, nil)
		labeled := len(p.Labels()) > 0
		if labeled != (name == "cache_aware") {
			t.Errorf("%s: labeled = %v", name, labeled)
		}
	}
}
