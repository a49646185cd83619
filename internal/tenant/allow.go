package tenant

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrNotAllowed is the error of an address outside --worker-url-allow.
var ErrNotAllowed = errors.New("outside --worker-url-allow")

// Allowed is where the router may connect to workers (--worker-url-allow): a list of IP
// prefixes, or anywhere when the list is empty. It is checked on the address actually dialled,
// after name resolution, so a worker name cannot later be pointed elsewhere (at the cloud
// metadata service, say) to make the router send prompts and the worker key there.
type Allowed struct{ prefixes []netip.Prefix }

// ParseAllowed reads CIDR prefixes ("10.0.0.0/8") or single addresses ("10.0.0.7").
func ParseAllowed(list []string) (Allowed, error) {
	var a Allowed
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			addr, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return Allowed{}, fmt.Errorf("%q is neither a CIDR prefix nor an IP address", s)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		a.prefixes = append(a.prefixes, p.Masked())
	}
	return a, nil
}

// Permits reports whether the router may connect to ip.
func (a Allowed) Permits(ip netip.Addr) bool {
	if len(a.prefixes) == 0 {
		return true
	}
	ip = ip.Unmap()
	for _, p := range a.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Control is a net.Dialer Control function that refuses a connection to an address outside
// the list before it is made.
func (a Allowed) Control(_, address string, _ syscall.RawConn) error {
	if len(a.prefixes) == 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !a.Permits(ip) {
		return fmt.Errorf("%s is %w", host, ErrNotAllowed)
	}
	return nil
}

// CheckURL refuses a normalised worker URL whose host is an IP address outside the list, at
// once; a host name is checked each time it is dialled.
func (a Allowed) CheckURL(workerURL string) error {
	if len(a.prefixes) == 0 {
		return nil
	}
	u, err := url.Parse(workerURL)
	if err != nil {
		return err
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil && !a.Permits(ip) {
		return fmt.Errorf("worker %s is %w", Redact(workerURL), ErrNotAllowed)
	}
	return nil
}
