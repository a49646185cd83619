package kvevents

import (
	"context"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestSetRunsASubscriberPerWantedWorkerAndForgetsTheRemovedOnes(t *testing.T) {
	p1, p2 := kvtest.New(t, "", false), kvtest.New(t, "", false)
	x := NewIndex(1 << 20)
	set := NewSet(x, nil)
	t.Cleanup(set.Close)
	ctx := context.Background()
	set.Sync(ctx, []Source{{Worker: "w1", Endpoint: p1.Endpoint}, {Worker: "w2", Endpoint: p2.Endpoint}})
	for _, c := range []struct {
		p    *kvtest.Publisher
		name tenant.ID
		base int
	}{{p1, "w1", 0}, {p2, "w2", 100}} {
		testkit.WaitFor(t, "blocks on "+string(c.name), func() bool {
			c.p.Send(stores(t, nil, c.base, 1), false) // until the subscriber joined; repeats re-store the block
			return x.Blocks(c.name) == 1
		})
	}
	if st := set.Status(); len(st) != 2 || st[0].Worker != "w1" || st[1].Worker != "w2" || st[0].Blocks != 1 || st[0].Batches == 0 {
		t.Fatalf("status %+v", st)
	}
	set.Sync(ctx, []Source{{Worker: "w2", Endpoint: p2.Endpoint}})
	if x.Blocks("w1") != 0 || len(set.Status()) != 1 {
		t.Fatalf("w1 left the fleet but is still indexed (%d blocks) or subscribed (%+v)", x.Blocks("w1"), set.Status())
	}
	if x.Blocks("w2") != 1 {
		t.Fatal("syncing w1 away took w2's blocks")
	}
}

func TestEndpointFillsTheHostAndOffsetsThePortByRank(t *testing.T) {
	for _, c := range []struct {
		template, host string
		rank           int
		want           string
	}{
		{"tcp://{host}:5557", "vllm-a", -1, "tcp://vllm-a:5557"},
		{"tcp://{host}:5557", "vllm-0.vllm", 2, "tcp://vllm-0.vllm:5559"},
		{"tcp://{host}:5557", "::1", 0, "tcp://[::1]:5557"},
		{"tcp://events.internal:6000", "ignored", 1, "tcp://events.internal:6001"},
	} {
		if got, err := Endpoint(c.template, c.host, c.rank); err != nil || got != c.want {
			t.Errorf("Endpoint(%q, %q, %d) = %q, %v; want %q", c.template, c.host, c.rank, got, err, c.want)
		}
	}
	for _, bad := range []string{"http://{host}:5557", "tcp://{host}", "tcp://{host}:port", "tcp://{host}:65535/x", "{host}:5557"} {
		if _, err := Endpoint(bad, "h", 1); err == nil || !strings.Contains(err.Error(), "kv events endpoint") {
			t.Errorf("Endpoint(%q): %v, want an error", bad, err)
		}
	}
}

func TestWorkerEndpointsAreCheckedLikeTheTemplateAndMustBeDialable(t *testing.T) {
	for _, ok := range []WorkerEndpoints{
		{},
		{Events: "tcp://{host}:5557"},
		{Events: "tcp://127.0.0.1:6001", Replay: "tcp://127.0.0.1:6002"},
		{Events: "tcp://[::1]:5557"},
	} {
		if err := ok.Check(); err != nil {
			t.Errorf("%+v: %v, want accepted", ok, err)
		}
	}
	for _, c := range []struct {
		e    WorkerEndpoints
		want string
	}{
		{WorkerEndpoints{Events: "http://{host}:5557"}, "want tcp://HOST:PORT"},
		{WorkerEndpoints{Events: "tcp://{host}"}, "no usable port"},
		{WorkerEndpoints{Events: "tcp://*:5557"}, "wildcard"},
		{WorkerEndpoints{Events: "tcp://0.0.0.0:5557"}, "wildcard"},
		{WorkerEndpoints{Events: "tcp://[::]:5557"}, "wildcard"},
		{WorkerEndpoints{Events: "tcp://{host}:5557", Replay: "tcp://*:5558"}, "wildcard"},
		{WorkerEndpoints{Replay: "tcp://{host}:5558"}, "needs an events endpoint"},
		{WorkerEndpoints{Events: "tcp://" + strings.Repeat("a", MaxEndpointLen) + ":5557"}, "longer than"},
	} {
		if err := c.e.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.e, err, c.want)
		}
	}
}
