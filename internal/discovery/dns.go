package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// LookupFunc resolves a name to all its addresses (A and AAAA records).
type LookupFunc func(ctx context.Context, name string) ([]netip.Addr, error)

// DNSOptions configure the DNS source.
type DNSOptions struct {
	Name    string        // resolved every Refresh, e.g. a headless Service "vllm.llm.svc.cluster.local"
	Port    int           // the workers' port on each address
	Refresh time.Duration // between lookups
	Lookup  LookupFunc    // nil: the system resolver
	Log     *slog.Logger
}

// DNS treats every address of one name as a ready worker. A lookup that finds that the name has
// no address empties the set; a lookup that fails otherwise (a timeout, a resolver that cannot be
// reached) keeps the set it had, so a resolver outage does not take every worker away.
//
// DNS knows no draining: a headless Service lists ready pods only, so a pod that turns NotReady
// leaves at the next lookup. Its requests in flight still finish; its sessions re-place.
type DNS struct {
	opts DNSOptions
}

// lookupTimeout bounds one lookup.
const lookupTimeout = 10 * time.Second

// NewDNS checks opts and returns the source; it does not resolve anything yet.
func NewDNS(opts DNSOptions) (*DNS, error) {
	if opts.Name == "" {
		return nil, errors.New("discovery: no DNS name")
	}
	if opts.Port < 1 || opts.Port > 65535 {
		return nil, fmt.Errorf("discovery: %d is not a port number", opts.Port)
	}
	if opts.Refresh <= 0 {
		return nil, errors.New("discovery: the DNS refresh interval must be positive")
	}
	if opts.Lookup == nil {
		opts.Lookup = func(ctx context.Context, name string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", name)
		}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &DNS{opts: opts}, nil
}

// Name is "dns".
func (d *DNS) Name() string { return "dns" }

// Run looks the name up now and every Refresh, reporting the set when it changes. The first set
// is reported after the first lookup that does not fail.
func (d *DNS) Run(ctx context.Context, update func([]Endpoint)) error {
	t := time.NewTicker(d.opts.Refresh)
	defer t.Stop()
	var last []Endpoint
	failing := false
	for {
		set, err := d.lookup(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				d.opts.Log.Warn("discovery: DNS lookup failed; keeping the workers found before", "name", d.opts.Name, "error", err)
			}
			failing = true
		case err == nil:
			if failing {
				d.opts.Log.Info("discovery: DNS lookup works again", "name", d.opts.Name, "addresses", len(set))
			}
			failing = false
			if last == nil || !Equal(set, last) {
				last = set
				update(set)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// lookup resolves the name once. A name that does not exist or has no address is an empty set.
func (d *DNS) lookup(ctx context.Context) ([]Endpoint, error) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	addrs, err := d.opts.Lookup(ctx, d.opts.Name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		addrs, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(d.opts.Port)
	eps := make([]Endpoint, 0, len(addrs))
	for _, a := range addrs {
		// A link-local address is reachable only through an interface of this host.
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() || a.IsLinkLocalUnicast() {
			continue
		}
		eps = append(eps, Endpoint{URL: "http://" + net.JoinHostPort(a.String(), port), Ready: true, Name: d.opts.Name})
	}
	return normalize(eps), nil
}
