package cacheaware

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// evictionCounter is a Reporter that counts what it is told, by kind.
type evictionCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *evictionCounter) Evicted(kind string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind] += n
}

func (c *evictionCounter) count(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[kind]
}

// chatInput is the policy input for body, without a session id, with every worker a candidate.
func chatInput(t *testing.T, pool *workers.Pool, body string) policy.Input {
	t.Helper()
	return policy.Input{Context: context.Background(), Request: req(t, body), Model: "m", Candidates: pool.All(), All: pool.All()}
}

func TestFailedAttemptDoesNotMakeTheWorkerTheHistorysHolder(t *testing.T) {
	pool, _ := fleet(t, 3)
	var reported evictionCounter
	p := New(defaultOptions(), &reported, slog.New(slog.NewTextHandler(io.Discard, nil)))
	in := chatInput(t, pool, chat(longSystem, []string{"task"}, ""))

	d := p.Select(in)
	if before := heldBy(p, in.Request, d.Worker.ID()); before != choiceOf(d).held {
		t.Fatalf("Select says %s held %d bytes, the tree says %d", d.Worker.ID(), choiceOf(d).held, before)
	}
	p.Accepted(in, d)
	if heldBy(p, in.Request, d.Worker.ID()) != len(in.Request.Text) {
		t.Fatal("Accepted did not teach the chosen worker the history")
	}
	p.Done(in, d, workers.Failed, policy.Usage{}) // unreachable, a 503, no first byte in time

	if got := heldBy(p, in.Request, d.Worker.ID()); got != choiceOf(d).held {
		t.Fatalf("after the failed attempt %s holds %d bytes of the history, held %d before", d.Worker.ID(), got, choiceOf(d).held)
	}
	if next := p.Select(in); next.Worker == d.Worker && next.Label == LabelCacheAffinity {
		t.Fatalf("the same history went back to %s as %s, which never served it", d.Worker.ID(), next.Label)
	}
	if n := reported.count("tree"); n != 0 {
		t.Fatalf("what the failed attempt taught was reported as %d bytes evicted", n)
	}
}

// attempt selects a worker for in, accepts it and ends the attempt with outcome and no usage, as
// the proxy does; it returns the decision.
func attempt(p *Policy, in policy.Input, outcome workers.Outcome) policy.Decision {
	d := p.Select(in)
	p.Accepted(in, d)
	p.Done(in, d, outcome, policy.Usage{})
	return d
}

func TestRetryAfterAFailedAttemptLeavesTheServingWorkerTheOnlyHolder(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	in := chatInput(t, pool, chat(longSystem, []string{"task"}, ""))

	failed := attempt(p, in, workers.Failed)
	// The proxy retries on another worker, which answers.
	in.Candidates = without(pool.All(), failed.Worker)
	served := attempt(p, in, workers.Succeeded)

	next := chatInput(t, pool, chat(longSystem, []string{"task", "done", "more"}, ""))
	d := p.Select(next)
	if d.Worker != served.Worker || d.Label != LabelCacheAffinity {
		t.Fatalf("next turn: %s on %s, want cache_affinity on %s, which served the conversation",
			d.Label, d.Worker.ID(), served.Worker.ID())
	}
	if got := heldBy(p, next.Request, failed.Worker.ID()); got != 0 {
		t.Fatalf("the worker that failed holds %d bytes of the conversation", got)
	}
}

func TestFailedNextTurnKeepsThePreviousTurnOnItsWorker(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	first := chatInput(t, pool, chat(longSystem, []string{"task"}, ""))
	home := attempt(p, first, workers.Succeeded)

	in := chatInput(t, pool, chat(longSystem, []string{"task", "done", "more"}, ""))
	d := p.Select(in)
	if d.Worker != home.Worker || choiceOf(d).held != len(first.Request.Text) {
		t.Fatalf("next turn: %s holding %d bytes, want %s holding the first turn's %d",
			d.Worker.ID(), choiceOf(d).held, home.Worker.ID(), len(first.Request.Text))
	}
	p.Accepted(in, d)
	p.Done(in, d, workers.Failed, policy.Usage{})

	if got := heldBy(p, in.Request, home.Worker.ID()); got != len(first.Request.Text) {
		t.Fatalf("after the failed turn %s holds %d bytes of it, want the first turn's %d", home.Worker.ID(), got, len(first.Request.Text))
	}
	if got := heldBy(p, first.Request, home.Worker.ID()); got != len(first.Request.Text) {
		t.Fatalf("%s holds %d bytes of the first turn, which it served, want all %d", home.Worker.ID(), got, len(first.Request.Text))
	}
}
