package cacheaware

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/tenant"
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
func holding(worker tenant.ID, ts []uint32, blocks int) *kvevents.Index {
	x := kvevents.NewIndex(1 << 20)
	store(x, worker, ts, blocks, 0)
	return x
}

// selectWith runs the policy on a chat request without session id that came with ts.
func selectWith(t *testing.T, p *Policy, pool *workers.Pool, ts []uint32) policy.Decision {
	t.Helper()
	r := req(t, `{"messages":[{"role":"user","content":"a prompt the tree has never seen"}]}`)
	return p.Select(withTokens(policy.Input{Request: r, Candidates: pool.All(), All: pool.All()}, ts, ""))
}

func TestEventsSendARequestWithoutSessionToTheWorkerWhoseEngineHoldsItsPrompt(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 5*16+7)
	opts := defaultOptions()
	opts.KVIndex = holding(ws[2].ID(), prompt, 4)
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
	opts.KVIndex = holding(ws[1].ID(), prompt, 2) // 32 tokens: worth 2 units of load
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

// --cache-index text routes on the prefix tree alone, events on the engines' events alone; auto
// (the default) takes the events where an engine holds part of the prompt, the tree elsewhere.
func TestCacheIndexChoosesWhichPictureOfTheCachesPlacesARequest(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 5*16)
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("a document the tree has seen on one worker ", 40) + `"}]}`
	place := func(index string, idx *kvevents.Index) policy.Decision {
		opts := defaultOptions()
		opts.KVIndex, opts.CacheIndex = idx, index
		p := newPolicy(opts)
		teach := policy.Input{Request: req(t, body), Candidates: pool.All(), All: pool.All()}
		in := withTokens(teach, prompt, "")
		p.Accepted(teach, policy.Decision{Worker: ws[0], Label: LabelCacheAffinity}) // the tree: ws[0] holds the text
		return p.Select(in)
	}
	heldBy2 := func() *kvevents.Index { return holding(ws[2].ID(), prompt, 4) }
	if d := place(IndexAuto, heldBy2()); d.Worker != ws[2] || d.Label != LabelKVEventsMatch {
		t.Errorf("auto, an engine holds it: %s on %s, want the events' holder", d.Label, d.Worker.Name())
	}
	if d := place(IndexText, heldBy2()); d.Worker != ws[0] || d.Label == LabelKVEventsMatch {
		t.Errorf("text: %s on %s, want the tree's holder", d.Label, d.Worker.Name())
	}
	empty := kvevents.NewIndex(1 << 20)
	if d := place(IndexAuto, empty); d.Worker != ws[0] {
		t.Errorf("auto, no engine holds it: %s on %s, want the tree's holder", d.Label, d.Worker.Name())
	}
	if d := place(IndexEvents, empty); d.Label != LabelLowMatch || d.Label == LabelKVEventsMatch {
		t.Errorf("events, no engine holds it: %s on %s, want the least loaded, not the tree", d.Label, d.Worker.Name())
	}
}

// store records that worker's engine stored the first blocks of ts, hashes from base+1.
func store(x *kvevents.Index, worker tenant.ID, ts []uint32, blocks, base int) {
	storeFor(x, worker, "", ts, blocks, base)
}

// sessionTurn is one turn of session "s1" to the policy, its tokens given by the policy's
// tokenizer only when the policy asks for them; the decision is accepted. It reports whether the
// tokens were asked.
func sessionTurn(t *testing.T, p *Policy, pool *workers.Pool, ts []uint32) (policy.Decision, bool) {
	t.Helper()
	return adapterSessionTurn(t, p, pool, ts, "")
}

// adapterSessionTurn is sessionTurn for a request whose tokens are for LoRA adapter lora.
func adapterSessionTurn(t *testing.T, p *Policy, pool *workers.Pool, ts []uint32, lora string) (policy.Decision, bool) {
	t.Helper()
	body := chat("", []string{"hello"}, "")
	in := policy.Input{Request: req(t, body, "x-session-id", "s1"), Body: []byte(body),
		Candidates: pool.All(), All: pool.All(), Prompt: &policy.PromptMemo{}}
	tk := &tokenizer{tokens: ts, lora: lora}
	p.opts.Tokenizer = tk
	d := p.Select(in)
	p.Accepted(in, d)
	return d, tk.calls > 0
}

func TestSessionWhoseWorkerClearedItsCacheMovesWithSessionEvicted(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 4*16)
	x := kvevents.NewIndex(1 << 20)
	store(x, ws[0].ID(), prompt, 4, 0)
	store(x, ws[2].ID(), prompt, 2, 100) // another worker holds part of it too
	p := policyReading(x)
	// The session's first turn is asked its tokens and lands on ws[0], which the events show
	// holding them.
	in := policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
		Candidates: pool.All(), All: pool.All()}
	if !p.wantsTokens(newDecision(in)) {
		t.Fatal("a session the policy has no first block for is not asked its tokens")
	}
	p.Accepted(withTokens(in, prompt, ""), policy.Decision{Worker: ws[0], Label: LabelFullHistoryMatch})

	if d, asked := sessionTurn(t, p, pool, prompt); asked || d.Label != LabelSessionMatch || d.Worker != ws[0] {
		t.Fatalf("worker still holds it: %s on %s (tokens asked: %v), want %s on %s without tokens",
			d.Label, d.Worker.Name(), asked, LabelSessionMatch, ws[0].Name())
	}
	x.Apply(ws[0].ID(), "", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.Cleared}}})
	d, asked := sessionTurn(t, p, pool, prompt)
	if !asked || d.Label != LabelSessionEvicted || d.Worker != ws[2] {
		t.Fatalf("after AllBlocksCleared: %s on %s (tokens asked: %v), want %s on %s, the events' holder",
			d.Label, d.Worker.Name(), asked, LabelSessionEvicted, ws[2].Name())
	}
	if want := float64(32) / float64(len(prompt)); d.Match != want {
		t.Fatalf("match %v, want the engine's share %v", d.Match, want)
	}
	if d, asked := sessionTurn(t, p, pool, prompt); asked || d.Label != LabelSessionMatch || d.Worker != ws[2] {
		t.Fatalf("the turn after the move: %s on %s (tokens asked: %v), want %s on %s", d.Label, d.Worker.Name(), asked,
			LabelSessionMatch, ws[2].Name())
	}
}

func TestSessionWhoseWorkerRemovedItsBlocksMovesWithSessionEvicted(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(1000, 3*16)
	x := kvevents.NewIndex(1 << 20)
	store(x, ws[1].ID(), prompt, 3, 0)
	store(x, ws[1].ID(), tokens(9000, 16), 1, 50) // the engine holds something else still
	p := policyReading(x)
	in := withTokens(policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
		Candidates: pool.All(), All: pool.All()}, prompt, "")
	p.Accepted(in, policy.Decision{Worker: ws[1], Label: LabelFullHistoryMatch})
	x.Apply(ws[1].ID(), "", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.Removed, BlockHashes: []kvevents.Hash{1, 2, 3}}}})
	if d, asked := sessionTurn(t, p, pool, prompt); !asked || d.Label != LabelSessionEvicted {
		t.Fatalf("after BlockRemoved of its blocks: %s on %s (tokens asked: %v), want %s", d.Label, d.Worker.Name(), asked,
			LabelSessionEvicted)
	}
}

// An engine publishes what it stored a little after storing it: a session whose worker has not
// yet published its first turn's blocks stays, asks no tokens, and is checked once they came.
func TestSessionWhoseBlocksAreNotPublishedYetStays(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(1000, 3*16)
	x := kvevents.NewIndex(1 << 20)
	store(x, ws[0].ID(), tokens(9000, 16), 1, 50) // the engine is known, the session's blocks not yet
	p := policyReading(x)
	in := withTokens(policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
		Candidates: pool.All(), All: pool.All()}, prompt, "")
	p.Accepted(in, policy.Decision{Worker: ws[0], Label: LabelFullHistoryMatch})
	if d, asked := sessionTurn(t, p, pool, prompt); asked || d.Label != LabelSessionMatch || d.Worker != ws[0] {
		t.Fatalf("blocks not published yet: %s on %s (tokens asked: %v), want %s on %s without tokens",
			d.Label, d.Worker.Name(), asked, LabelSessionMatch, ws[0].Name())
	}
	store(x, ws[0].ID(), prompt, 3, 0) // published now, seen at the next accepted turn
	p.Accepted(policy.Input{Request: in.Request, Candidates: pool.All(), All: pool.All()}, policy.Decision{Worker: ws[0], Label: LabelSessionMatch})
	x.Apply(ws[0].ID(), "", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.Cleared}}})
	if d, asked := sessionTurn(t, p, pool, prompt); !asked || d.Label != LabelSessionEvicted {
		t.Fatalf("seen, then cleared: %s on %s (tokens asked: %v), want %s", d.Label, d.Worker.Name(), asked, LabelSessionEvicted)
	}
}

func TestSessionStaysWithoutEventsOrWhenItsWorkersEngineIsUnknown(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(1000, 3*16)
	for _, tc := range []struct {
		name string
		x    *kvevents.Index
	}{
		{"no events", nil},
		{"the engine published nothing", kvevents.NewIndex(1 << 20)},
	} {
		opts := defaultOptions()
		opts.KVIndex = tc.x
		tk := &tokenizer{tokens: prompt}
		opts.Tokenizer = tk
		p := newPolicy(opts)
		in := withTokens(policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
			Candidates: pool.All(), All: pool.All()}, prompt, "")
		p.Accepted(in, policy.Decision{Worker: ws[1], Label: LabelFullHistoryMatch})
		if d := p.Select(in); d.Label != LabelSessionMatch || d.Worker != ws[1] {
			t.Errorf("%s: %s on %s, want %s on %s", tc.name, d.Label, d.Worker.Name(), LabelSessionMatch, ws[1].Name())
		}
		again := policy.Input{Request: in.Request, Candidates: pool.All(), All: pool.All(), Prompt: &policy.PromptMemo{}}
		if p.Select(again); tc.x == nil && tk.calls > 0 {
			t.Errorf("%s: a session request is asked its tokens", tc.name)
		}
	}
}

func TestSessionBlocksAreBounded(t *testing.T) {
	s := newSessionBlocks(3)
	for i := range 10 {
		s.put("m", fmt.Sprint(i), sessionBlock{first: uint64(i)})
	}
	if n := s.len(); n != 3 {
		t.Fatalf("%d sessions kept, want the capacity 3", n)
	}
	if _, ok := s.get("m", "0"); ok {
		t.Fatal("the first session recorded is still kept")
	}
	if b, ok := s.get("m", "9"); !ok || b.first != 9 {
		t.Fatalf("the last session recorded: %+v %v", b, ok)
	}
}

// policyReading is a policy with the default options that reads the engines' events in x.
func policyReading(x *kvevents.Index) *Policy {
	opts := defaultOptions()
	opts.KVIndex = x
	return newPolicy(opts)
}

// storeFor is store for blocks computed with LoRA adapter lora.
func storeFor(x *kvevents.Index, worker tenant.ID, lora string, ts []uint32, blocks, base int) {
	e := kvevents.Event{Kind: kvevents.Stored, BlockSize: 16, TokenIDs: ts[:blocks*16], LoRA: lora}
	for i := range blocks {
		e.BlockHashes = append(e.BlockHashes, kvevents.Hash(base+i+1))
	}
	x.Apply(worker, "", kvevents.Batch{Events: []kvevents.Event{e}})
}

func TestEventsMatchARequestOnlyAgainstTheBlocksOfItsOwnAdapter(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 4*16)
	x := kvevents.NewIndex(1 << 20)
	storeFor(x, ws[0].ID(), "", prompt, 4, 0)
	storeFor(x, ws[1].ID(), "sql", prompt, 4, 100)
	p := policyReading(x)
	sel := func(lora string) policy.Decision {
		r := req(t, `{"messages":[{"role":"user","content":"a prompt the tree has never seen"}]}`)
		return p.Select(withTokens(policy.Input{Request: r, Candidates: pool.All(), All: pool.All()}, prompt, lora))
	}
	for lora, want := range map[string]*workers.Worker{"": ws[0], "sql": ws[1]} {
		if d := sel(lora); d.Worker != want || d.Label != LabelKVEventsMatch {
			t.Fatalf("adapter %q: %s on %s, want %s on %s", lora, d.Label, d.Worker.Name(), LabelKVEventsMatch, want.Name())
		}
	}
	if d := sel("chat"); d.Label == LabelKVEventsMatch {
		t.Fatalf("adapter chat matched another model's blocks: %s on %s", d.Label, d.Worker.Name())
	}
}

// An adapter's session records its first block keyed with the adapter: its worker is seen
// holding it, and when that worker's engine clears it, the session moves, placed by the events
// of its adapter alone, where the base model's blocks of the same tokens count for nothing.
func TestAnAdaptersSessionIsCheckedAgainstItsAdaptersBlocks(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(1000, 4*16)
	x := kvevents.NewIndex(1 << 20)
	storeFor(x, ws[0].ID(), "sql", prompt, 4, 0)
	storeFor(x, ws[1].ID(), "", prompt, 4, 100)
	p := policyReading(x)
	in := withTokens(policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
		Candidates: pool.All(), All: pool.All()}, prompt, "sql")
	p.Accepted(in, policy.Decision{Worker: ws[0], Label: LabelFullHistoryMatch})
	if d, asked := adapterSessionTurn(t, p, pool, prompt, "sql"); asked || d.Label != LabelSessionMatch || d.Worker != ws[0] {
		t.Fatalf("its worker holds it: %s on %s (tokens asked: %v), want %s on %s", d.Label, d.Worker.Name(), asked,
			LabelSessionMatch, ws[0].Name())
	}
	x.Apply(ws[0].ID(), "", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.Cleared}}})
	d, asked := adapterSessionTurn(t, p, pool, prompt, "sql")
	if !asked || d.Label != LabelSessionEvicted || d.Match != 0 {
		t.Fatalf("after AllBlocksCleared: %s on %s, match %v (tokens asked: %v), want %s matching nothing",
			d.Label, d.Worker.Name(), d.Match, asked, LabelSessionEvicted)
	}
}

// With the tree beside the events (auto), a conversation the tree saw placed stays on its worker
// while that worker's engine holds as much of the prompt as any other, even when another holder
// is less busy: under a small cache, where every worker's copy is partial, staying keeps one copy
// of it instead of two. A worker whose engine holds less than another's is weighed by cost again,
// and --cache-index events does not ask the tree.
func TestAConversationTheTreeSawPlacedStaysWhileItsEngineHoldsAsMuchAsAny(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(0, 4*16)
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("one conversation's own history ", 40) + `"}]}`
	index := func(held0, held1 int) *kvevents.Index {
		x := kvevents.NewIndex(1 << 20)
		storeFor(x, ws[0].ID(), "", prompt, held0, 0)
		storeFor(x, ws[1].ID(), "", prompt, held1, 0)
		return x
	}
	if pool.Acquire(ws[0]) == nil { // the conversation's worker is the busier one
		t.Fatal("breaker refused")
	}
	place := func(cacheIndex string, idx *kvevents.Index) policy.Decision {
		opts := defaultOptions()
		opts.LoadUnitTokens, opts.BalanceAbsThreshold = 16, 1000
		opts.KVIndex, opts.CacheIndex = idx, cacheIndex
		p := newPolicy(opts)
		teach := policy.Input{Request: req(t, body), Candidates: pool.All(), All: pool.All()}
		in := withTokens(teach, prompt, "")
		p.Accepted(teach, policy.Decision{Worker: ws[0], Label: LabelCacheAffinity}) // the tree: ws[0] has it
		return p.Select(in)
	}
	if d := place(IndexAuto, index(2, 2)); d.Worker != ws[0] || d.Label != LabelKVEventsMatch {
		t.Errorf("auto, both engines hold as much: %s on %s, want the conversation's worker", d.Label, d.Worker.Name())
	}
	if d := place(IndexEvents, index(2, 2)); d.Worker != ws[1] {
		t.Errorf("events alone, both engines hold as much: %s on %s, want the less busy", d.Label, d.Worker.Name())
	}
	if d := place(IndexAuto, index(1, 3)); d.Worker != ws[1] || d.Label != LabelKVEventsMatch {
		t.Errorf("auto, the other engine holds more: %s on %s, want it by cost", d.Label, d.Worker.Name())
	}
}

// A session that came while its worker's engine had published nothing is not tokenized again on
// every turn until the engine publishes (its events could decide nothing), but once, when the
// engine is known, to record its first block.
func TestASessionPlacedBeforeItsEngineIsKnownIsTokenizedOnceTheEngineIs(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(1000, 3*16)
	x := kvevents.NewIndex(1 << 20)
	p := policyReading(x)
	later := policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
		Candidates: pool.All(), All: pool.All()}
	wants := func() bool { return p.wantsTokens(newDecision(later)) }
	if !wants() {
		t.Fatal("a new session is not asked its tokens")
	}
	in := withTokens(later, prompt, "")
	p.Accepted(in, policy.Decision{Worker: ws[1], Label: LabelFullHistoryMatch})
	if wants() {
		t.Fatal("asked again while its worker's engine has published nothing")
	}
	storeFor(x, ws[1].ID(), "", tokens(90000, 16), 1, 500) // the engine publishes another prompt's block
	if !wants() {
		t.Fatal("not asked once its worker's engine is known, so its first block is never recorded")
	}
	p.Accepted(in, policy.Decision{Worker: ws[1], Label: LabelSessionMatch})
	if wants() {
		t.Fatal("asked again after its first block was recorded")
	}
}

// A block an engine holds offloaded (CPU, disk) saves its prefill at --kv-offloaded-block-weight
// of a GPU block's: three offloaded blocks at half weight are worth less than two on a GPU, and
// as much as three at full weight.
func TestOffloadedBlocksCountAtTheirWeight(t *testing.T) {
	pool, ws := fleet(t, 2)
	prompt := tokens(0, 4*16)
	for _, c := range []struct {
		weight float64
		want   int
	}{{0.5, 1}, {1, 0}} {
		x := kvevents.NewIndex(1 << 20)
		for i, held := range []struct {
			blocks    int
			offloaded bool
		}{{3, true}, {2, false}} {
			e := kvevents.Event{Kind: kvevents.Stored, BlockSize: 16, TokenIDs: prompt[:held.blocks*16], Offloaded: held.offloaded}
			for b := range held.blocks {
				e.BlockHashes = append(e.BlockHashes, kvevents.Hash(b+1))
			}
			x.Apply(ws[i].ID(), "", kvevents.Batch{Events: []kvevents.Event{e}})
		}
		opts := defaultOptions()
		opts.LoadUnitTokens, opts.BalanceAbsThreshold = 16, 1000
		opts.KVIndex, opts.OffloadedWeight = x, c.weight
		if d := selectWith(t, newPolicy(opts), pool, prompt); d.Worker != ws[c.want] || d.Label != LabelKVEventsMatch {
			t.Errorf("weight %v: %s on %s, want kv_events_match on %s", c.weight, d.Label, d.Worker.Name(), ws[c.want].Name())
		}
	}
}

// A session the router does not know (its first turn here) that came with its tokens is placed by
// what the engines hold, as a request without session key is, ahead of the prefix tree; with
// --cache-index text, by the tree.
func TestAnUnknownSessionIsPlacedByTheEventsBeforeTheTree(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 5*16)
	body := chat("", []string{strings.Repeat("a document the tree has seen on one worker ", 40)}, "")
	for _, c := range []struct {
		index string
		want  int
		label string
	}{{IndexAuto, 2, LabelKVEventsMatch}, {IndexText, 0, LabelFullHistoryMatch}} {
		opts := defaultOptions()
		opts.KVIndex, opts.CacheIndex = holding(ws[2].ID(), prompt, 4), c.index
		p := newPolicy(opts)
		teach := policy.Input{Request: req(t, body, "x-session-id", "other"), Candidates: pool.All(), All: pool.All()}
		p.Accepted(teach, policy.Decision{Worker: ws[0], Label: LabelCacheAffinity}) // the tree: ws[0] holds the text
		in := withTokens(policy.Input{Request: req(t, body, "x-session-id", "new"), Candidates: pool.All(), All: pool.All()}, prompt, "")
		if d := p.Select(in); d.Worker != ws[c.want] || d.Label != c.label {
			t.Errorf("%s: %s on %s, want %s on %s", c.index, d.Label, d.Worker.Name(), c.label, ws[c.want].Name())
		}
	}
}

// The policy asks its tokenizer for the tokens of a request without session key among several
// candidates, and a retry's Select of the same request (its memo) uses them without asking again.
func TestARetriedRequestIsMatchedByTheTokensItsFirstSelectAsked(t *testing.T) {
	pool, ws := fleet(t, 3)
	prompt := tokens(1000, 5*16+7)
	opts := defaultOptions()
	opts.KVIndex = holding(ws[2].ID(), prompt, 4)
	tk := &tokenizer{tokens: prompt}
	opts.Tokenizer = tk
	p := newPolicy(opts)
	body := `{"messages":[{"role":"user","content":"a prompt the tree has never seen"}]}`
	in := policy.Input{Request: req(t, body), Body: []byte(body), Candidates: pool.All(), All: pool.All(), Prompt: &policy.PromptMemo{}}
	if d := p.Select(in); d.Worker != ws[2] || d.Label != LabelKVEventsMatch {
		t.Fatalf("first Select: %s on %s, want %s on %s", d.Label, d.Worker.Name(), LabelKVEventsMatch, ws[2].Name())
	}
	in.Candidates = []*workers.Worker{ws[0], ws[2]} // the retry, without a refused worker
	if d := p.Select(in); d.Worker != ws[2] || d.Label != LabelKVEventsMatch {
		t.Fatalf("retry: %s on %s, want %s on %s", d.Label, d.Worker.Name(), LabelKVEventsMatch, ws[2].Name())
	}
	if tk.calls != 1 {
		t.Fatalf("tokenizer asked %d times for one request, want once", tk.calls)
	}
}
