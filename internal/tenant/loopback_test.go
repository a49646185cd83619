package tenant

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

// hosts is a resolver of fixed answers.
func hosts(m map[string][]string) func(context.Context, string) ([]netip.Addr, error) {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		list, ok := m[host]
		if !ok {
			return nil, errors.New("no such host")
		}
		var out []netip.Addr
		for _, s := range list {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}
}

// A loopback address, the unspecified address and a localhost name that resolves to loopback
// addresses only reach one worker when they share an address and the rest of the URL; any other
// host is its own worker.
func TestLoopbackSpellingsOfOneWorkerShareAnAddress(t *testing.T) {
	lookup := hosts(map[string][]string{"localhost": {"127.0.0.1", "::1"}, "v4.localhost": {"127.0.0.1"}})
	at := func(raw string) Loopback {
		u, err := ParseURL(raw)
		if err != nil {
			t.Fatal(err)
		}
		return LookupLoopback(t.Context(), u, lookup)
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"http://localhost:8000", "http://127.0.0.1:8000", true},
		{"http://localhost:8000", "http://[::1]:8000", true},
		{"http://v4.localhost:8000/x/..", "http://127.0.0.1:8000", true},
		{"http://0.0.0.0:8000", "http://127.0.0.1:8000", true},
		{"http://[::]:8000", "http://localhost:8000", true},
		{"http://v4.localhost:8000", "http://[::1]:8000", false},
		{"http://localhost:8000", "http://127.0.0.1:8001", false},
		{"http://localhost:8000", "https://127.0.0.1:8000", false},
		{"http://localhost:8000/a", "http://127.0.0.1:8000", false},
		{"http://u:p@localhost:8000", "http://127.0.0.1:8000", false},
		{"http://127.0.0.2:8000", "http://127.0.0.1:8000", false},
		{"http://gone.localhost:8000", "http://127.0.0.1:8000", false}, // does not resolve
	} {
		_, same := at(c.a).Shares(at(c.b))
		_, back := at(c.b).Shares(at(c.a))
		if same != c.same || back != c.same {
			t.Errorf("%s and %s: one worker %v (%v the other way), want %v", c.a, c.b, same, back, c.same)
		}
	}
	for _, raw := range []string{"http://127.0.0.5:1", "http://localhost", "http://[::]:9"} {
		if at(raw).IsZero() {
			t.Errorf("%s: no loopback address", raw)
		}
	}
	if !at("http://gpu-0:8000").IsZero() {
		t.Error("a name other than localhost's was taken for this machine")
	}
}
