package telemetry

import (
	"os/exec"
	"strings"
	"testing"
)

// The router links no gRPC: spans leave over OTLP/HTTP through the router's own client, and the
// SDK's OTLP exporters or the generated OTLP collector package would each bring gRPC back.
func TestTheRouterLinksNoGRPC(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the router's packages")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/cacheroute/cacheroute/cmd/cacheroute").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for pkg := range strings.Lines(string(out)) {
		if strings.Contains(pkg, "google.golang.org/grpc") || strings.Contains(pkg, "grpc-ecosystem") {
			t.Errorf("the router links %s", strings.TrimSpace(pkg))
		}
	}
}
