package tenant

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Loopback is where a worker URL points when its host is this machine: the loopback addresses
// its host names, and the rest of the URL (scheme, credentials, port, path). Two worker URLs with
// the same rest and a loopback address in common reach one listening socket, so they are one
// worker whatever their spelling ("http://localhost:8000" and "http://127.0.0.1:8000"). The
// zero Loopback is a URL whose host is not this machine, or not known to be.
type Loopback struct {
	addrs []netip.Addr
	rest  string
}

// loopbackLookupTimeout bounds the lookup of a localhost name (/etc/hosts, normally).
const loopbackLookupTimeout = time.Second

// LookupLoopback finds where u points on this machine, when its host is a loopback address, the
// unspecified address (which a connection reaches the loopback through: "0.0.0.0" as 127.0.0.1,
// "[::]" as ::1), or a localhost name ("localhost", "*.localhost", RFC 6761), resolved now by
// the system's resolver and kept only when every address it gives is a loopback one. Any other
// name is not resolved: a name may stand for many workers, or point elsewhere tomorrow, so it
// is its own worker. lookup nil is the system's resolver.
func LookupLoopback(ctx context.Context, u URL, lookup func(ctx context.Context, host string) ([]netip.Addr, error)) Loopback {
	p, err := url.Parse(u.String())
	if err != nil {
		return Loopback{}
	}
	host := p.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		switch {
		case a.IsLoopback():
			addrs = []netip.Addr{a}
		case a.IsUnspecified() && a.Is4():
			addrs = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1})}
		case a.IsUnspecified():
			addrs = []netip.Addr{netip.IPv6Loopback()}
		}
	} else if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		if lookup == nil {
			lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			}
		}
		ctx, cancel := context.WithTimeout(ctx, loopbackLookupTimeout)
		defer cancel()
		found, err := lookup(ctx, host)
		if err != nil {
			return Loopback{}
		}
		for _, a := range found {
			if a = a.Unmap(); !a.IsLoopback() {
				return Loopback{}
			}
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return Loopback{}
	}
	p.Host = ":" + p.Port() // the URL is canonical: its default port is left out
	return Loopback{addrs: addrs, rest: p.String()}
}

// IsZero reports whether l knows of no loopback address.
func (l Loopback) IsZero() bool { return len(l.addrs) == 0 }

// Shares reports whether l and o are one worker: the same rest of the URL and a loopback address
// in common, which it returns.
func (l Loopback) Shares(o Loopback) (netip.Addr, bool) {
	if l.IsZero() || l.rest != o.rest {
		return netip.Addr{}, false
	}
	for _, a := range l.addrs {
		if slices.Contains(o.addrs, a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}
