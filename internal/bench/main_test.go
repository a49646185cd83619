package bench_test

import (
	"os"
	"testing"

	"github.com/cacheroute/cacheroute/internal/bench"
	"github.com/cacheroute/cacheroute/internal/cli"
)

// TestMain lets the test binary stand in for the cacheroute program: started with
// bench.RouterChildEnv set, it runs the command line it is given (a router, for the --fronts
// tests) instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(bench.RouterChildEnv) != "" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}
