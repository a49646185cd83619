// Package registry is the one place that knows every routing policy by name: --policy, the bench
// and the demo resolve names here, and nothing else compares policy names. Each policy registers
// itself (policy.Register, from its package's init) with its summary and, when it has knobs, its
// options: they bind their own flags with their defaults and validate their own values, so that
// internal/config binds and checks every policy's knobs without importing any policy. The
// package imports no policy; the policies' factories are in internal/policy.
package registry

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/pflag"
)

// Options are one policy's knobs.
type Options interface {
	// Bind registers each knob on fs as a flag that writes into the options, its default the
	// knob's current value.
	Bind(fs *pflag.FlagSet)
	// Validate checks the values; each error names its flag ("--name: ...").
	Validate() []error
}

// Spec describes one policy to the configuration: its --policy name, a one-line summary for help
// texts, whether it is the default, and its options.
type Spec struct {
	Name    string
	Summary string
	// Default marks the policy --policy takes when not given; exactly one policy has it.
	Default bool
	// Options returns the policy's knobs at their defaults; nil for a policy without knobs.
	Options func() Options
}

var (
	mu    sync.RWMutex
	specs []Spec
)

// Register adds a policy, found by its name from then on. It is meant for package
// initialisation, and panics on a name already taken, which is a programming error.
func Register(s Spec) {
	mu.Lock()
	defer mu.Unlock()
	if slices.ContainsFunc(specs, func(o Spec) bool { return o.Name == s.Name }) {
		panic("policy registered twice: " + s.Name)
	}
	specs = append(specs, s)
}

// Specs lists every policy, the default first, then in the order they registered.
func Specs() []Spec {
	mu.RLock()
	defer mu.RUnlock()
	out := slices.Clone(specs)
	slices.SortStableFunc(out, func(a, b Spec) int {
		switch {
		case a.Default == b.Default:
			return 0
		case a.Default:
			return -1
		}
		return 1
	})
	return out
}

// Names lists every policy name, the default first.
func Names() []string {
	var out []string
	for _, s := range Specs() {
		out = append(out, s.Name)
	}
	return out
}

// Default is the default policy's name, "" when none registered as the default.
func Default() string {
	for _, s := range Specs() {
		if s.Default {
			return s.Name
		}
	}
	return ""
}

// Lookup returns the policy called name.
func Lookup(name string) (Spec, bool) {
	for _, s := range Specs() {
		if s.Name == name {
			return s, true
		}
	}
	return Spec{}, false
}

// Unknown is the error for a name no policy has.
func Unknown(name string) error {
	return fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(Names(), ", "))
}
