package config

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// Discovery reports whether any worker discovery is configured (--service-discovery or
// --dns-discovery), so that a router with no static worker still has a way to find some.
func (c Config) Discovery() bool { return c.ServiceDiscovery || c.DNSDiscovery != "" }

// DNSRefresh is --dns-refresh-secs.
func (c Config) DNSRefresh() time.Duration { return secs(c.DNSRefreshSecs) }

// SelectorString is --selector as a Kubernetes equality-based label selector ("k=v,k2=v2").
func (c Config) SelectorString() string { return strings.Join(c.Selector, ",") }

// RoleSelector is one role's label selector of worker pods ("k=v,k2=v2").
type RoleSelector struct {
	Role     workers.Role
	Selector string
}

// Selectors are the non-empty pod selectors by role: --selector (colocated), --prefill-selector,
// --decode-selector; each is watched on its own.
func (c Config) Selectors() []RoleSelector {
	var out []RoleSelector
	for _, s := range c.selectorFlags() {
		if len(s.values) > 0 {
			out = append(out, RoleSelector{Role: s.role, Selector: strings.Join(s.values, ",")})
		}
	}
	return out
}

// selectorFlags are the pod selectors by role, with their flags.
func (c Config) selectorFlags() []roleFlag {
	return []roleFlag{
		{"selector", c.Selector, workers.RoleColocated},
		{"prefill-selector", c.PrefillSelector, workers.RolePrefill},
		{"decode-selector", c.DecodeSelector, workers.RoleDecode},
	}
}

// DNSTarget splits --dns-discovery into the name to resolve and the workers' port.
func (c Config) DNSTarget() (name string, port int, err error) {
	host, p, err := net.SplitHostPort(c.DNSDiscovery)
	if err != nil {
		return "", 0, fmt.Errorf("want NAME:PORT, got %q", c.DNSDiscovery)
	}
	if host == "" {
		return "", 0, fmt.Errorf("want NAME:PORT, the name is empty in %q", c.DNSDiscovery)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("%q is not a port number (1-65535)", p)
	}
	return host, n, nil
}

// validateDiscovery checks the discovery knobs.
func validateDiscovery(bad func(flag, format string, args ...any), c Config) {
	for _, sf := range c.selectorFlags() {
		for _, s := range sf.values {
			if err := checkSelectorTerm(s); err != nil {
				bad(sf.flag, "%v", err)
			}
		}
		if !c.ServiceDiscovery && len(sf.values) > 0 {
			bad(sf.flag, "has no effect without --service-discovery")
		}
	}
	if c.ServiceDiscovery && len(c.Selectors()) == 0 {
		// An empty selector matches every pod of the namespace, the router's own among them.
		bad("selector", "required with --service-discovery (at least one key=value), unless --prefill-selector or --decode-selector is given")
	}
	if c.ServiceDiscoveryPort < 1 || c.ServiceDiscoveryPort > 65535 {
		bad("service-discovery-port", "%d is not a port number (1-65535)", c.ServiceDiscoveryPort)
	}
	if ns := c.ServiceDiscoveryNamespace; ns != "" && (len(ns) > 63 || !dnsLabel.MatchString(ns)) {
		bad("service-discovery-namespace", "%q is not a namespace name (lower-case letters, digits and '-', at most 63)", ns)
	}
	if c.DNSDiscovery != "" {
		if _, _, err := c.DNSTarget(); err != nil {
			bad("dns-discovery", "%v", err)
		}
	}
	if !(c.DNSRefreshSecs > 0) {
		bad("dns-refresh-secs", "must be positive, got %v", c.DNSRefreshSecs)
	}
}

// Kubernetes label syntax: a name segment, an optional DNS-subdomain prefix before '/', and
// values that are empty or shaped like a name segment.
var (
	labelName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsLabel  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// checkSelectorTerm accepts one key=value term of an equality-based label selector.
func checkSelectorTerm(term string) error {
	key, value, ok := strings.Cut(term, "=")
	if !ok || strings.HasPrefix(value, "=") || strings.HasSuffix(key, "!") {
		return fmt.Errorf("%q: want key=value", term)
	}
	name := key
	if prefix, rest, found := strings.Cut(key, "/"); found {
		if prefix == "" || len(prefix) > 253 || !subdomain.MatchString(prefix) {
			return fmt.Errorf("%q: the key's prefix %q is not a DNS subdomain", term, prefix)
		}
		name = rest
	}
	if len(name) == 0 || len(name) > 63 || !labelName.MatchString(name) {
		return fmt.Errorf("%q: %q is not a label key (letters, digits, '-', '_', '.', at most 63, alphanumeric at both ends)", term, key)
	}
	if len(value) > 63 || (value != "" && !labelName.MatchString(value)) {
		return fmt.Errorf("%q: %q is not a label value (letters, digits, '-', '_', '.', at most 63, alphanumeric at both ends)", term, value)
	}
	return nil
}
