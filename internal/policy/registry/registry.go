// Package registry is the one place that knows every routing policy by name: --policy, the bench
// and the demo resolve names here, and nothing else compares policy names.
package registry

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
)

// Options are everything any policy may be built from; each constructor takes what it needs.
type Options struct {
	CacheAware cacheaware.Options
	// Reporter receives cache_aware's state events (evictions); nil reports nothing.
	Reporter cacheaware.Reporter
	Log      *slog.Logger
}

// Entry is one policy: its --policy name, a one-line summary for help texts, and its constructor.
type Entry struct {
	Name    string
	Summary string
	New     func(Options) policy.Policy
}

// entries lists the policies, the default first; Register adds more.
var entries = []Entry{
	{cacheaware.Name, "session affinity, then the longest cached prefix, then least load; a load-balance gate overrides affinity",
		func(o Options) policy.Policy {
			log := o.Log
			if log == nil {
				log = slog.New(slog.DiscardHandler)
			}
			return cacheaware.New(o.CacheAware, o.Reporter, log)
		}},
	{policy.NameRoundRobin, "each candidate in turn", func(Options) policy.Policy { return &policy.RoundRobin{} }},
	{policy.NameRandom, "a candidate uniformly at random", func(Options) policy.Policy { return policy.Random{} }},
	{policy.NamePowerOfTwo, "the less loaded of two random candidates", func(Options) policy.Policy { return policy.PowerOfTwo{} }},
	{policy.NameConsistentHash, "a hash ring over the session or routing key", func(Options) policy.Policy { return policy.NewConsistentHash() }},
	{policy.NameRendezvous, "highest random weight over the session or routing key", func(Options) policy.Policy { return policy.Rendezvous{} }},
}

// Register adds a policy, found by its name from then on (--policy, the bench, the demo). It is
// meant for package initialisation; it panics on a name already taken, which is a programming
// error.
func Register(e Entry) {
	if _, ok := Lookup(e.Name); ok {
		panic("policy registered twice: " + e.Name)
	}
	entries = append(entries, e)
}

// Names lists every policy name, the default first.
func Names() []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Name
	}
	return out
}

// Lookup returns the entry called name.
func Lookup(name string) (Entry, bool) {
	for _, e := range entries {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// New builds the policy called name.
func New(name string, o Options) (policy.Policy, error) {
	e, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(Names(), ", "))
	}
	return e.New(o), nil
}
