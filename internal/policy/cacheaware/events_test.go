package cacheaware

import (
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// tokens are n token ids from start.
func tokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// holding is an index where worker holds the first blocks of ts, in blocks of 16 tokens.
func holding(worker string, ts []uint32, blocks int) *kvevents.Index {
	x := kvevents.NewIndex(1 << 20)
	e := kvevents.Event{Kind: kvevents.Stored, BlockSize: 16, TokenIDs: ts[:blocks*16]}
	for i := range blocks {
		e.BlockHashes = append(e.BlockHashes, kvevents.Hash(i+1))
	}
	x.Apply(worker, "", kvevents.Batch{Events: []kvevents.Event{e}})
	return x
}

// selectWith runs the policy on a chat request without session id that came with ts.
func selectWith(t *testing.T, p *Policy, pool *workers.Pool, ts []uint32) policy.Decision {
	t.Helper()
	r := req(t, `{"messages":[{"role":"user","content":"a prompt the tree has never seen"}]}`)
	in := policy.Input{Request: r, Candidates: pool.All(), All: pool.All(), Tokens: ts}
	return p.Select(in)
}

func TestEventsSendARequestWithoutSessionToTheWorkerWhoseEngineHoldsItsPrompt(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 5*16+7)
	opts := defaultOptions()
	opts.KVIndex = holding(ws[2].Name(), prompt, 4)
	p := newPolicy(opts)
	d := selectWith(t, p, pool, prompt)
	if d.Worker != ws[2] || d.Label != LabelKVEventsMatch {
		t.Fatalf("%s on %s, want %s on %s", d.Label, d.Worker.Name(), LabelKVEventsMatch, ws[2].Name())
	}
	if want := float64(64) / float64(len(prompt)); d.Match != want {
		t.Fatalf("match %v, want the engine's share %v", d.Match, want)
	}
	// Without tokens, or with tokens no engine holds, the events decide nothing.
	if d := selectWith(t, p, pool, nil); d.Label == LabelKVEventsMatch {
		t.Fatalf("a request without tokens: %s", d.Label)
	}
	if d := selectWith(t, p, pool, tokens(50000, 5*16)); d.Label == LabelKVEventsMatch {
		t.Fatalf("a prompt no engine holds: %s on %s", d.Label, d.Worker.Name())
	}
}

func TestEventsWeighWhatAWorkerHoldsAgainstItsLoad(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(0, 4*16)
	opts := defaultOptions()
	opts.LoadUnitTokens = 16 // one request in flight is worth one block of prefill
	opts.BalanceAbsThreshold = 1000
	opts.KVIndex = holding(ws[1].Name(), prompt, 2) // 32 tokens: worth 2 units of load
	p := newPolicy(opts)
	if d := selectWith(t, p, pool, prompt); d.Worker != ws[1] {
		t.Fatalf("idle fleet: %s on %s, want the holder", d.Label, d.Worker.Name())
	}
	for range 3 { // the holder is now 3 busier: more than its 2 blocks save
		if pool.Acquire(ws[1]) == nil {
			t.Fatal("breaker refused")
		}
	}
	if d := selectWith(t, p, pool, prompt); d.Worker != ws[0] || d.Label == LabelKVEventsMatch {
		t.Fatalf("busy holder: %s on %s, want the idle worker, not by the events", d.Label, d.Worker.Name())
	}
}
