package discovery

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// resolver is an in-process name server for one name: its answer is whatever the test sets.
type resolver struct {
	mu     sync.Mutex
	addrs  []netip.Addr
	err    error
	asked  []string
	lookup chan struct{} // a tick per lookup
}

func newResolver(addrs ...string) *resolver {
	r := &resolver{lookup: make(chan struct{}, 64)}
	r.set(addrs...)
	return r
}

func (r *resolver) set(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs, r.err = nil, nil
	for _, a := range addrs {
		r.addrs = append(r.addrs, netip.MustParseAddr(a))
	}
}

func (r *resolver) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *resolver) Lookup(_ context.Context, name string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, name)
	select {
	case r.lookup <- struct{}{}:
	default:
	}
	if r.err != nil {
		return nil, r.err
	}
	return append([]netip.Addr(nil), r.addrs...), nil
}

func (r *resolver) waitLookups(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-r.lookup:
		case <-time.After(10 * time.Second):
			t.Fatal("no lookup")
		}
	}
}

func dnsSource(t *testing.T, r *resolver) *recorder {
	t.Helper()
	src, err := NewDNS(DNSOptions{Name: "vllm.llm.svc.cluster.local", Port: 8000, Refresh: 5 * time.Millisecond, Lookup: r.Lookup})
	if err != nil {
		t.Fatal(err)
	}
	return runSource(t, src)
}

// oneWorkerByDNS starts a DNS source over a resolver answering 10.0.0.1 and returns both once the
// source has its one worker: the start of the tests of what changes in the answers do to it.
func oneWorkerByDNS(t *testing.T) (*resolver, *recorder) {
	t.Helper()
	r := newResolver("10.0.0.1")
	rec := dnsSource(t, r)
	rec.waitFor(t, "the worker", is("http://10.0.0.1:8000", true))
	return r, rec
}

func TestDNSEveryAddressIsAReadyWorker(t *testing.T) {
	r := newResolver("10.0.0.2", "fd00::7", "10.0.0.1", "::ffff:10.0.0.2", "fe80::1%eth0")
	rec := dnsSource(t, r)
	rec.waitFor(t, "the addresses, once each, sorted, without the link-local one", is(
		"http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true, "http://[fd00::7]:8000", true))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked[0] != "vllm.llm.svc.cluster.local" {
		t.Fatalf("asked for %q", r.asked[0])
	}
}

func TestDNSAddressesThatAppearJoinAndThoseThatGoLeave(t *testing.T) {
	r := newResolver("10.0.0.1", "10.0.0.2")
	rec := dnsSource(t, r)
	rec.waitFor(t, "two workers", is("http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true))
	r.set("10.0.0.2", "10.0.0.3")
	rec.waitFor(t, "one left, one joined", is("http://10.0.0.2:8000", true, "http://10.0.0.3:8000", true))
}

func TestDNSFailedLookupKeepsTheWorkers(t *testing.T) {
	r, rec := oneWorkerByDNS(t)
	_, before := rec.last()
	r.fail(&net.DNSError{Err: "i/o timeout", Name: "vllm.llm.svc.cluster.local", IsTimeout: true})
	r.waitLookups(t, 5)
	r.fail(errors.New("connection refused"))
	r.waitLookups(t, 5)
	if set, n := rec.last(); n != before || !is("http://10.0.0.1:8000", true)(set) {
		t.Fatalf("after failed lookups: %v (%d sets, %d before)", set, n, before)
	}
	r.set("10.0.0.1", "10.0.0.4")
	rec.waitFor(t, "the lookups working again", is("http://10.0.0.1:8000", true, "http://10.0.0.4:8000", true))
}

func TestDNSNameWithoutAddressesEmptiesTheSet(t *testing.T) {
	r, rec := oneWorkerByDNS(t)
	// A headless Service with no ready pod has no records: NXDOMAIN.
	r.fail(&net.DNSError{Err: "no such host", Name: "vllm.llm.svc.cluster.local", IsNotFound: true})
	rec.waitFor(t, "no workers", is())
}

func TestDNSReportsNothingUntilALookupWorks(t *testing.T) {
	r := newResolver()
	r.fail(errors.New("server misbehaving"))
	rec := dnsSource(t, r)
	r.waitLookups(t, 3)
	if _, n := rec.last(); n != 0 {
		t.Fatalf("%d sets reported while every lookup failed", n)
	}
	r.set()
	rec.waitFor(t, "an empty set once a lookup works", is())
}

func TestDNSLooksUpAgainEveryRefresh(t *testing.T) {
	r := newResolver("10.0.0.1")
	src, err := NewDNS(DNSOptions{Name: "w", Port: 1, Refresh: 20 * time.Millisecond, Lookup: r.Lookup})
	if err != nil {
		t.Fatal(err)
	}
	runSource(t, src)
	start := time.Now()
	r.waitLookups(t, 4) // the first at once, then one per refresh
	if elapsed := time.Since(start); elapsed < 40*time.Millisecond {
		t.Fatalf("4 lookups in %v with a 20ms refresh", elapsed)
	}
}

func TestNewDNSChecksItsOptions(t *testing.T) {
	for _, opts := range []DNSOptions{
		{Name: "", Port: 8000, Refresh: time.Second},
		{Name: "w", Port: 0, Refresh: time.Second},
		{Name: "w", Port: 8000, Refresh: 0},
	} {
		if _, err := NewDNS(opts); err == nil {
			t.Errorf("NewDNS(%+v) accepted", opts)
		}
	}
}
