package registry

import (
	"slices"
	"testing"
)

func TestNewBuildsEveryListedPolicyUnderItsName(t *testing.T) {
	names := Names()
	if names[0] != "cache_aware" {
		t.Errorf("the default policy is listed first; got %q", names[0])
	}
	for _, name := range names {
		p, err := New(name, Options{})
		if err != nil {
			t.Errorf("New(%q): %v", name, err)
			continue
		}
		if p.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, p.Name())
		}
		if e, _ := Lookup(name); e.Summary == "" {
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
		if _, err := New(name, Options{}); err == nil {
			t.Errorf("New(%q) succeeded", name)
		}
	}
}

func TestTwoRoundRobinsKeepCountersOfTheirOwn(t *testing.T) {
	a, _ := New("round_robin", Options{})
	b, _ := New("round_robin", Options{})
	if a == b {
		t.Error("two round_robin policies share their state")
	}
}

func TestOnlyCacheAwareLabelsBeyondItsName(t *testing.T) {
	for _, name := range Names() {
		p, _ := New(name, Options{})
		labeled := len(p.Labels()) > 0
		if labeled != (name == "cache_aware") {
			t.Errorf("%s: labeled = %v", name, labeled)
		}
	}
}
