package cacheaware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// document is a long shared context (a file, a RAG passage, a big tool output): about 5,000
// tokens, worth about 5 requests in flight at the default --load-unit-tokens 1024.
var document = strings.Repeat("The quarterly report lists revenue, costs and the outlook. ", 340)

// withDocument is a new conversation that starts with the document and goes on with a long text
// of its own, so the document is well under the 30% threshold of the whole.
func withDocument(own string) string {
	return chat(document, []string{strings.Repeat(own+" ", 80_000/len(own))}, "")
}

func costOptions(mode string) Options {
	o := defaultOptions()
	o.HistoryMatchMode = mode
	o.LoadUnitTokens = 1024
	return o
}

// reserve puts n requests in flight on w until the test ends.
func reserve(t *testing.T, w *workers.Worker, n int) {
	for range n {
		t.Cleanup(w.Reserve().Release)
	}
}

func TestCostMode_ALongDocumentBelowTheThresholdGoesToItsHolderWhileItIsWorthIt(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(costOptions(HistoryCost))
	first := route(p, pool, req(t, withDocument("first question")))
	holder := first.Worker
	if m := float64(len(document)) / float64(len(req(t, withDocument("second question")).Text)); m >= 0.3 {
		t.Fatalf("the document is %.0f%% of the prompt; the test needs it under the threshold", m*100)
	}
	reserve(t, holder, 3) // busier than the idle workers, not by more than the document is worth
	d := route(p, pool, req(t, withDocument("second question")))
	if d.Worker != holder || d.Label != LabelCacheAffinity {
		t.Fatalf("a new conversation on the document with its holder 3 requests busier: %s on %s, want %s on %s",
			d.Label, d.Worker.ID(), LabelCacheAffinity, holder.ID())
	}
}

func TestCostMode_ASwampedHolderLosesTheDocumentToAnIdleWorker(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(costOptions(HistoryCost))
	holder := route(p, pool, req(t, withDocument("first question"))).Worker
	reserve(t, holder, 12) // far busier than the document's prefill is worth, still below the gate
	d := route(p, pool, req(t, withDocument("second question")))
	if d.Worker == holder || d.Label != LabelLowMatch {
		t.Fatalf("a new conversation on the document with its holder swamped: %s on %s, want %s elsewhere",
			d.Label, d.Worker.ID(), LabelLowMatch)
	}
}

func TestThresholdMode_IgnoresAMatchBelowTheThreshold(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(costOptions(HistoryThreshold))
	holder := route(p, pool, req(t, withDocument("first question"))).Worker
	reserve(t, holder, 1)
	d := route(p, pool, req(t, withDocument("second question")))
	if d.Worker == holder || d.Label != LabelLowMatch {
		t.Fatalf("threshold mode: %s on %s, want %s on an idle worker", d.Label, d.Worker.ID(), LabelLowMatch)
	}
}

func TestCostMode_WithASessionTheLabelsAreTheHistoryStepsOwn(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(costOptions(HistoryCost))
	holder := route(p, pool, req(t, withDocument("first question"), "x-session-id", "a")).Worker
	if d := route(p, pool, req(t, withDocument("second question"), "x-session-id", "b")); d.Worker != holder || d.Label != LabelFullHistoryMatch {
		t.Fatalf("new session on the document: %s on %s, want %s on the holder", d.Label, d.Worker.ID(), LabelFullHistoryMatch)
	}
	reserve(t, holder, 12)
	if d := route(p, pool, req(t, withDocument("third question"), "x-session-id", "c")); d.Worker == holder || d.Label != LabelHistoryLowMatch {
		t.Fatalf("new session on the document, holder swamped: %s on %s, want %s elsewhere", d.Label, d.Worker.ID(), LabelHistoryLowMatch)
	}
}

// Whatever the loads and however much of a document under the threshold each worker holds, the
// cost mode picks a worker whose load plus prefill is the least, counting the match in whole
// blocks.
func TestCostMode_ChoosesTheLeastCostlyWorker(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	busierHolder, byLoad := 0, 0
	for trial := range 200 {
		_, ws := fleet(t, 4)
		p := newPolicy(costOptions(HistoryCost))
		doc := strings.Repeat(fmt.Sprintf("doc %d line. ", trial), 100+rng.IntN(1000))
		// Some workers hold the document alone, some the document and a first question.
		for _, w := range ws {
			switch rng.IntN(3) {
			case 1:
				p.tree.Insert("m", req(t, chat(doc, nil, "")).Text, w.ID())
			case 2:
				p.tree.Insert("m", req(t, chat(doc, []string{"q"}, "")).Text, w.ID())
			}
		}
		var leases []*workers.Lease
		for _, w := range ws {
			for range rng.IntN(10) {
				leases = append(leases, w.Reserve())
			}
		}
		r := req(t, chat(doc, []string{"q", "a", strings.Repeat("new ", 15000+rng.IntN(20000))}, ""))
		in := policy.Input{Context: context.Background(), Request: r, Model: "m", Candidates: ws, All: ws}
		d := p.Select(in)
		cost := func(w *workers.Worker) int64 {
			held := holdOf(p, "m", r.Text, w.ID()).Held / blockBytes * blockBytes
			return w.Load()*1024*bytesPerToken + int64(len(r.Text)-held)
		}
		if d.Label == LabelLoadBalance {
			continue // the gate decided
		}
		minLoad := d.Worker.Load()
		for _, w := range ws {
			if cost(w) < cost(d.Worker) {
				t.Fatalf("trial %d: %s (%s) costs %d, %s costs %d", trial, d.Worker.ID(), d.Label, cost(d.Worker), w.ID(), cost(w))
			}
			minLoad = min(minLoad, w.Load())
		}
		if d.Worker.Load() > minLoad {
			busierHolder++
		} else {
			byLoad++
		}
		for _, l := range leases {
			l.Release()
		}
	}
	if busierHolder == 0 || byLoad == 0 {
		t.Fatalf("the trials never exercised both sides: %d chose a busier holder, %d the least loaded", busierHolder, byLoad)
	}
}
