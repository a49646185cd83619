package dashboard

import (
	"context"
	"testing"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// Each worker row of the status page's data carries the worker's role.
func TestWorkerShowsItsRole(t *testing.T) {
	d, _, _ := newTest(t)
	for _, w := range d.opts.Pool.All() {
		w.SetRole(workers.RoleDecode)
	}
	data := d.Data(context.Background())
	if len(data.Workers) != 1 || data.Workers[0].Role != "decode" {
		t.Fatalf("workers %+v, want one decode worker", data.Workers)
	}
}
