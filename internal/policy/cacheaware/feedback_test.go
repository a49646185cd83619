package cacheaware

import (
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// selectCommit routes r among ws, as the proxy does, and returns the input with the decision.
func selectCommit(t *testing.T, p *Policy, ws []*workers.Worker, body string) (policy.Input, policy.Decision) {
	t.Helper()
	in := chatInputAmong(t, ws, body)
	d := p.Select(in)
	p.Accepted(in, d)
	return in, d
}

func chatInputAmong(t *testing.T, ws []*workers.Worker, body string) policy.Input {
	t.Helper()
	return policy.Input{Request: req(t, body), Model: "m", Candidates: ws, All: ws}
}

func TestServed_AWorkerThatEvictedIsNoLongerCountedOnForWhatItUsedBefore(t *testing.T) {
	_, ws := fleet(t, 2)
	p := newPolicy(costOptions(HistoryCost))
	older := strings.Repeat("An older manual, chapter by chapter. ", 200)
	newer := strings.Repeat("A newer contract, clause by clause. ", 200)
	only := ws[:1] // the first worker serves both documents
	selectCommit(t, p, only, chat(older, []string{"first question"}, ""))
	selectCommit(t, p, only, chat(newer, []string{"first question"}, ""))

	// Before any feedback the tree sends a new conversation on the older manual to its holder.
	probe := chatInputAmong(t, ws, chat(older, []string{"another question"}, ""))
	if d := p.Select(probe); d.Worker != ws[0] || d.Label != LabelCacheAffinity {
		t.Fatalf("before feedback: %s on %s, want %s on %s", d.Label, d.Worker.ID(), LabelCacheAffinity, ws[0].ID())
	}

	// A conversation on the newer contract goes to the first worker, which reports that it served
	// none of it from cache: it evicted the contract, and with it the older manual.
	in, d := selectCommit(t, p, ws, chat(newer, []string{"second question"}, ""))
	if d.Worker != ws[0] || choiceOf(d).held == 0 {
		t.Fatalf("the contract's conversation went to %s holding %d bytes, want the holder", d.Worker.ID(), choiceOf(d).held)
	}
	if !p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: 0}) {
		t.Fatal("a worker serving 0 of a predicted large prefix was not corrected")
	}
	if d := p.Select(probe); d.Label != LabelLowMatch {
		t.Fatalf("after the correction a conversation on the evicted manual: %s on %s, want %s (nobody holds it)", d.Label, d.Worker.ID(), LabelLowMatch)
	}
	// The contract the worker has just prefilled again is still counted.
	if held := heldBy(p, req(t, chat(newer, []string{"third question"}, "")), ws[0].ID()); held < len(newer) {
		t.Errorf("the worker holds %d bytes of the contract it just prefilled, want at least %d", held, len(newer))
	}
}

func TestServed_KeepsAPredictionTheWorkerMet(t *testing.T) {
	_, ws := fleet(t, 2)
	p := newPolicy(costOptions(HistoryCost))
	doc := strings.Repeat("A long shared document. ", 300)
	selectCommit(t, p, ws[:1], chat(doc, []string{"q1"}, ""))
	in, d := selectCommit(t, p, ws, chat(doc, []string{"q2"}, ""))
	predicted := int(d.Match * 2000)
	for _, cached := range []int{predicted, predicted - 16, predicted/2 + 1} {
		if p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: cached}) {
			t.Errorf("served %d of %d predicted cached tokens: corrected, want kept", cached, predicted)
		}
	}
	if p.Done(in, policy.Decision{Worker: d.Worker, Label: d.Label}, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: 0}) {
		t.Error("a decision that predicted nothing was corrected")
	}
	if held := heldBy(p, in.Request, ws[0].ID()); held != len(in.Request.Text) {
		t.Errorf("the worker holds %d bytes after met predictions, want %d", held, len(in.Request.Text))
	}
}

func TestServed_CorrectsNothingWhenCorrectionIsDisabled(t *testing.T) {
	_, ws := fleet(t, 2)
	opts := costOptions(HistoryCost)
	opts.DisableCorrection = true
	p := newPolicy(opts)
	doc := strings.Repeat("A long shared document. ", 300)
	selectCommit(t, p, ws[:1], chat(doc, []string{"q1"}, ""))
	in, d := selectCommit(t, p, ws, chat(doc, []string{"q2"}, ""))
	if choiceOf(d).held == 0 || p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: 0}) {
		t.Fatalf("held %d; a disabled correction corrected", choiceOf(d).held)
	}
}

func TestServed_AWorkerServingMoreThanPredictedWidensItsReach(t *testing.T) {
	_, ws := fleet(t, 2)
	p := newPolicy(costOptions(HistoryCost))
	doc := strings.Repeat("A long shared document. ", 300)
	selectCommit(t, p, ws[:1], chat(doc, []string{"q1"}, ""))
	selectCommit(t, p, ws[:1], chat(strings.Repeat("Another text. ", 300), []string{"q"}, ""))
	in, d := selectCommit(t, p, ws[:1], chat(doc, []string{"q2"}, ""))
	if !p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: 0}) {
		t.Fatal("not corrected")
	}
	before := p.tree.ReachOf(ws[0].ID()).Horizon
	in, d = selectCommit(t, p, ws[:1], chat(strings.Repeat("Unknown text. ", 300), []string{"q"}, ""))
	if p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 2000, Cached: 1500}) {
		t.Fatal("serving more than predicted counted as an eviction")
	}
	if after := p.tree.ReachOf(ws[0].ID()).Horizon; after <= before {
		t.Fatalf("horizon %d after the worker served more than predicted, was %d", after, before)
	}
}

// A worker whose horizon no longer covers a conversation still gets that conversation's next
// turn: a whole earlier request of it is a prefix of the turn, no worker holds more of it. A new
// conversation on the same text is no continuation and is placed without it.
func TestEvictedWorkerStillGetsTheNextTurnOfItsOwnConversation(t *testing.T) {
	_, ws := fleet(t, 2)
	p := newPolicy(costOptions(HistoryCost))
	system := strings.Repeat("A long system prompt about the codebase. ", 100)
	turn1 := chat(system, []string{"fix the bug"}, "")
	selectCommit(t, p, ws[:1], turn1)
	selectCommit(t, p, ws[:1], chat(strings.Repeat("Other work. ", 400), []string{"q"}, ""))
	age := holdOf(p, "m", req(t, turn1).Text, ws[0].ID()).Age
	p.tree.Evicted(ws[0].ID(), age) // the worker lost the first conversation
	reserve(t, ws[0], 1)            // and is busier than the other

	if d := p.Select(chatInputAmong(t, ws, chat(system, []string{"fix the bug", "done", "now the tests"}, ""))); d.Worker != ws[0] || d.Label != LabelCacheAffinity {
		t.Fatalf("turn 2 of the conversation: %s on %s, want %s on its worker %s", d.Label, d.Worker.ID(), LabelCacheAffinity, ws[0].ID())
	}
	if d := p.Select(chatInputAmong(t, ws, chat(system, []string{"write the docs"}, ""))); d.Worker != ws[1] {
		t.Fatalf("a new conversation on the lost prompt: %s on %s, want the idle %s", d.Label, d.Worker.ID(), ws[1].ID())
	}
}
