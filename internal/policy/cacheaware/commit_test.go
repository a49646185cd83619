package cacheaware

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

func TestSelectAloneTeachesNothing(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	r := req(t, chat(longSystem, []string{"task"}, ""), "x-session-id", "s")
	in := policy.Input{Context: context.Background(), Request: r, Model: "m", Candidates: pool.All(), All: pool.All()}
	for range 5 {
		d := p.Select(in)
		if d.Label == LabelSessionMatch {
			t.Fatal("a selection that was never committed became the session's holder")
		}
		if heldBy(p, r, d.Worker.ID()) != 0 {
			t.Fatal("a selection that was never committed taught the tree")
		}
	}
	if p.TreeChars() != 0 || p.Sessions()["m"] != 0 {
		t.Fatalf("Select changed state: tree %d bytes, sessions %v", p.TreeChars(), p.Sessions())
	}
}

func TestCommitMakesTheAcceptedWorkerTheHolder(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	r := req(t, chat(longSystem, []string{"task"}, ""), "x-session-id", "s")
	in := policy.Input{Context: context.Background(), Request: r, Model: "m", Candidates: pool.All(), All: pool.All()}
	first := p.Select(in)
	// The proxy could not take first.Worker (its breaker refused): it chooses again without it,
	// and commits the second choice only.
	in.Candidates = without(pool.All(), first.Worker)
	second := p.Select(in)
	p.Accepted(in, second)
	in.Candidates = pool.All()
	next := p.Select(in)
	if next.Label != LabelSessionMatch || next.Worker != second.Worker {
		t.Fatalf("next turn: %s on %s, want session_id_match on the committed %s", next.Label, next.Worker.ID(), second.Worker.ID())
	}
	if heldBy(p, r, first.Worker.ID()) != 0 {
		t.Fatal("the refused worker holds the history")
	}
}

func TestFailedAttemptDoesNotKeepTheSessionPinned(t *testing.T) {
	pool, _ := fleet(t, 2)
	p := newPolicy(defaultOptions())
	r := req(t, chat(longSystem, []string{"task"}, ""), "x-session-id", "s")
	in := policy.Input{Context: context.Background(), Request: r, Model: "m", Candidates: pool.All(), All: pool.All()}
	attempt(p, in, workers.Failed) // it answered 503, say
	if tenant, ok, _ := p.store.Get(context.Background(), "m", r.SessionKey); ok {
		t.Fatalf("the session still points at %s, which failed", tenant)
	}
	// Success and cancellation keep what Accepted taught.
	for _, o := range []workers.Outcome{workers.Succeeded, workers.Cancelled} {
		d := attempt(p, in, o)
		if tenant, ok, _ := p.store.Get(context.Background(), "m", r.SessionKey); !ok || tenant != d.Worker.ID() {
			t.Fatalf("after %s the session points at %q, want %s", o, tenant, d.Worker.ID())
		}
	}
}

func TestTreeBudgetBoundsAllModelsTogether(t *testing.T) {
	opts := defaultOptions()
	opts.MaxTreeSize = 256 << 10
	pool, _ := fleet(t, 2)
	p := newPolicy(opts)
	for i := range 2000 {
		model := fmt.Sprintf("model-%d", i%20)
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, strings.Repeat(fmt.Sprintf("conversation %d ", i), 20))
		route(p, pool, req(t, body))
		if got := p.TreeBytes(); got > opts.MaxTreeSize*11/10 {
			t.Fatalf("after %d requests over 20 models the tree holds %d bytes, over 1.1x the one budget %d", i+1, got, opts.MaxTreeSize)
		}
	}
}

func without(ws []*workers.Worker, w *workers.Worker) []*workers.Worker {
	var out []*workers.Worker
	for _, x := range ws {
		if x != w {
			out = append(out, x)
		}
	}
	return out
}
