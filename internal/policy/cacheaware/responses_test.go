package cacheaware

import (
	"context"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// continuing is a Responses turn that continues the stored response id, with its new input.
func continuing(id, session string) *protocol.Request {
	r := &protocol.Request{Model: "m", Chat: true, PreviousResponseID: id, Text: "u11:next input."}
	if session != "" {
		r.SessionKey = "session:" + session
	}
	return r
}

func TestTurnContinuingAStoredResponseGoesToItsWorkerDespiteTheGate(t *testing.T) {
	pool, ws := fleet(t, 3)
	p := newPolicy(defaultOptions())
	p.ResponseStored(context.Background(), "resp_1", ws[2])
	for range 100 { // far beyond the balance gate: affinity of any other kind would yield
		ws[2].Reserve()
	}
	d := route(p, pool, continuing("resp_1", ""))
	if d.Label != LabelResponseMatch || d.Worker != ws[2] {
		t.Fatalf("%s on %v, want response_id_match on %s", d.Label, d.Worker, ws[2].ID())
	}
}

func TestContinuationDoesNotTeachItsInputAsAHistory(t *testing.T) {
	pool, ws := fleet(t, 2)
	p := newPolicy(defaultOptions())
	p.ResponseStored(context.Background(), "resp_1", ws[0])
	r := continuing("resp_1", "conv")
	route(p, pool, r)
	if p.TreeChars() != 0 {
		t.Fatalf("the tree learned %d chars of a continuation's partial input", p.TreeChars())
	}
	// Its conversation id is a session key like any other: it follows the worker.
	if tenant, ok, _ := p.store.Get(context.Background(), "m", "session:conv"); !ok || tenant != ws[0].ID() {
		t.Fatalf("conversation session points at %q, want %s", tenant, ws[0].ID())
	}
}

func TestResponseOfARemovedWorkerIsRefusedAsNotFound(t *testing.T) {
	pool, ws := fleet(t, 3)
	p := newPolicy(defaultOptions())
	p.ResponseStored(context.Background(), "resp_gone", ws[1])
	url := ws[1].URL()
	if _, err := pool.Remove(url); err != nil {
		t.Fatal(err)
	}
	p.WorkerRemoved(url) // drops sessions pointing at it, but not what it stored
	d := route(p, pool, continuing("resp_gone", ""))
	if d.Label != LabelResponseGone || d.Worker != nil || d.Refusal == nil || d.Refusal.Status != 404 {
		t.Fatalf("got %s on %v refusal %+v, want response_id_gone 404 with no worker", d.Label, d.Worker, d.Refusal)
	}
	if !strings.Contains(d.Refusal.Message, "resp_gone") {
		t.Fatalf("message %q does not name the id", d.Refusal.Message)
	}
}

func TestResponseOfAnUnavailableWorkerIsRefusedForNow(t *testing.T) {
	pool, ws := fleet(t, 3)
	p := newPolicy(defaultOptions())
	p.ResponseStored(context.Background(), "resp_1", ws[0])
	ws[0].SetHealthy(false)
	d := route(p, pool, continuing("resp_1", ""))
	if d.Label != LabelResponseUnavailable || d.Refusal == nil || d.Refusal.Status != 503 {
		t.Fatalf("got %s refusal %+v, want response_id_unavailable 503", d.Label, d.Refusal)
	}
	ws[0].SetHealthy(true)
	if d := route(p, pool, continuing("resp_1", "")); d.Worker != ws[0] {
		t.Fatalf("healthy again: %s on %v, want %s", d.Label, d.Worker, ws[0].ID())
	}
}

func TestUnknownResponseIDIsPlacedByTheRestOfTheChain(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	home := route(p, pool, req(t, chat("", []string{"x"}, ""), "x-session-id", "conv")).Worker
	d := route(p, pool, continuing("resp_never_seen", "conv"))
	if d.Label != LabelSessionMatch || d.Worker != home {
		t.Fatalf("%s on %v, want session_id_match on %s", d.Label, d.Worker, home.ID())
	}
	if d := route(p, pool, continuing("resp_never_seen", "")); d.Worker == nil || d.Refusal != nil {
		t.Fatalf("no session: refused or unplaced: %+v", d)
	}
}

func TestStoredResponsesAreNotCountedAsAModelsSessions(t *testing.T) {
	_, ws := fleet(t, 1)
	p := newPolicy(defaultOptions())
	p.ResponseStored(context.Background(), "resp_1", ws[0])
	if n, ok := p.Sessions()[responseNamespace]; ok {
		t.Fatalf("stored responses reported as %d sessions of model %q", n, responseNamespace)
	}
}

func TestDeletedResponseIsForgotten(t *testing.T) {
	_, ws := fleet(t, 1)
	p := newPolicy(defaultOptions())
	ctx := context.Background()
	p.ResponseStored(ctx, "resp_1", ws[0])
	if tenant, ok := p.ResponseHolder(ctx, "resp_1"); !ok || tenant != ws[0].ID() {
		t.Fatalf("holder %q %v", tenant, ok)
	}
	p.ResponseDeleted(ctx, "resp_1")
	if _, ok := p.ResponseHolder(ctx, "resp_1"); ok {
		t.Fatal("a deleted response is still followed")
	}
}

func TestLongResponseIDsAreKeptAsAFixedSizeHash(t *testing.T) {
	_, ws := fleet(t, 2)
	p := newPolicy(defaultOptions())
	ctx := context.Background()
	long := strings.Repeat("r", 10_000)
	p.ResponseStored(ctx, long, ws[1])
	if tenant, ok := p.ResponseHolder(ctx, long); !ok || tenant != ws[1].ID() {
		t.Fatalf("long id: holder %q %v", tenant, ok)
	}
	if _, ok := p.ResponseHolder(ctx, long[:9_999]); ok {
		t.Fatal("a different long id shares the entry")
	}
	if k := responseKey(long); len(k) > 64 {
		t.Fatalf("key of a long id is %d bytes", len(k))
	}
}
