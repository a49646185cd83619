package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// --port-range is read and checked against the ports the demo listens on before anything starts;
// its help names that count.
func TestDemoPortRangeIsCheckedBeforeTheDemoStarts(t *testing.T) {
	if _, _, err := run(context.Background(), "demo", "--quiet", "--port-range", "20000"); err == nil || !strings.Contains(err.Error(), "want LO-HI") {
		t.Errorf("--port-range 20000: %v", err)
	}
	_, _, err := run(context.Background(), "demo", "--quiet", "--out-chart", t.TempDir()+"/c.svg", "--port-range", "20000-20010")
	if err == nil || !strings.Contains(err.Error(), "--port-range 20000-20010 holds 11 ports; this run listens on 12") {
		t.Fatalf("a range of 11 ports: %v", err)
	}
	usage := newDemoCommand().Flags().Lookup("port-range").Usage
	if !strings.Contains(usage, fmt.Sprintf("%d ports", 12)) {
		t.Errorf("--port-range help: %q", usage)
	}
}
