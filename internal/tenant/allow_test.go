package tenant

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestAllowedListPermitsOnlyItsPrefixes(t *testing.T) {
	a, err := ParseAllowed([]string{"10.0.0.0/8", " 192.168.1.7 ", "fd00::/8"})
	if err != nil {
		t.Fatal(err)
	}
	for ip, want := range map[string]bool{
		"10.1.2.3": true, "192.168.1.7": true, "192.168.1.8": false, "169.254.169.254": false,
		"fd12::1": true, "::ffff:10.0.0.1": true, "127.0.0.1": false,
	} {
		if got := a.Permits(netip.MustParseAddr(ip)); got != want {
			t.Errorf("%s: %v, want %v", ip, got, want)
		}
	}
	if _, err := ParseAllowed([]string{"10.0.0.0/33"}); err == nil {
		t.Error("a bad prefix was accepted")
	}
	if !(Allowed{}).Permits(netip.MustParseAddr("169.254.169.254")) {
		t.Error("an empty list must permit everything")
	}
}

func TestAllowedListRefusesLiteralWorkerURLsAtOnce(t *testing.T) {
	a, _ := ParseAllowed([]string{"10.0.0.0/8"})
	if err := a.CheckURL("http://169.254.169.254:80"); err == nil || !strings.Contains(err.Error(), "--worker-url-allow") {
		t.Errorf("metadata address: %v", err)
	}
	if err := a.CheckURL("http://10.0.0.5:8000"); err != nil {
		t.Error(err)
	}
	if err := a.CheckURL("http://worker.internal:8000"); err != nil {
		t.Errorf("a name is checked when dialled, not here: %v", err)
	}
}

func TestAllowedListStopsTheDialOutsideIt(t *testing.T) {
	ln := testkit.Listen(t)
	defer ln.Close()
	a, _ := ParseAllowed([]string{"10.0.0.0/8"})
	d := net.Dialer{Timeout: 2 * time.Second, Control: a.Control}
	if c, err := d.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatal("a dial to an address outside the list connected")
	}
	open, _ := ParseAllowed([]string{"127.0.0.0/8"})
	d.Control = open.Control
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("a dial inside the list failed: %v", err)
	}
	c.Close()
}
