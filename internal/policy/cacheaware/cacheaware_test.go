package cacheaware

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/prefixtree"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// fleet is n healthy workers http://w0 … http://w(n-1).
func fleet(t testing.TB, n int) (*workers.Pool, []*workers.Worker) {
	t.Helper()
	pool := workers.NewPool(workers.Options{DPSize: 1, CBFailureThreshold: 10, CBTimeout: time.Second})
	var ws []*workers.Worker
	for i := range n {
		added, err := pool.Add(fmt.Sprintf("http://w%d", i))
		if err != nil {
			t.Fatal(err)
		}
		added[0].SetHealthy(true)
		ws = append(ws, added[0])
	}
	return pool, ws
}

func defaultOptions() Options {
	return Options{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, MaxTreeSize: 1 << 20,
		EvictionInterval: time.Minute, SessionTTL: time.Hour, MaxSessions: 1000, OffloadedWeight: DefaultOffloadedBlockWeight}
}

func newPolicy(opts Options) *Policy {
	return New(opts, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// req parses a request body with optional header pairs.
func req(t testing.TB, body string, header ...string) *protocol.Request {
	t.Helper()
	r, err := protocol.ParseChat(testkit.Header(header...), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// route selects among the available workers of pool, as the proxy does.
func route(p *Policy, pool *workers.Pool, r *protocol.Request) policy.Decision {
	var cands []*workers.Worker
	for _, w := range pool.All() {
		if w.Available() {
			cands = append(cands, w)
		}
	}
	in := policy.Input{Context: context.Background(), Request: r, Model: r.Model, Candidates: cands, All: pool.All()}
	d := p.Select(in)
	p.Accepted(in, d)
	return d
}

// heldBy is how many bytes of r's history key the tree says worker holds.
func heldBy(p *Policy, r *protocol.Request, worker tenant.ID) int {
	d := newDecision(policy.Input{Request: r, Model: r.Model})
	return holdOf(p, d.model, d.text, worker).Held
}

// holdOf is what the tree says worker holds of key in namespace ns.
func holdOf(p *Policy, ns, key string, worker tenant.ID) prefixtree.Hold {
	var probe prefixtree.Probe
	p.tree.Probe(&probe, ns, key, nil)
	return probe.Of(worker)
}

// chat renders a conversation body: system prompt, then the given user/assistant turns.
func chat(system string, turns []string, extra string) string {
	var msgs []string
	if system != "" {
		msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":%q}`, system))
	}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":%q}`, role, t))
	}
	return `{"model":"m","messages":[` + strings.Join(msgs, ",") + `]` + extra + `}`
}

var longSystem = strings.Repeat("You are a careful coding agent. Follow the tool protocol. ", 40)

func TestSessionIDWithSharedPrefixDoesNotFollowShorterID(t *testing.T) {
	pool, ws := fleet(t, 2)
	p := newPolicy(defaultOptions())
	first := route(p, pool, req(t, chat("", []string{"task one"}, ""), "x-session-id", "session-1"))
	// Make the first session's worker busier (below the gate), so a prefix probe of the id would
	// show by sending session-12 there, while exact matching sends it to the idle worker.
	lease := first.Worker.Reserve()
	defer lease.Release()
	// Its text shares nothing with the first's, so no history match sends it there either.
	second := route(p, pool, req(t, chat("", []string{"another task"}, ""), "x-session-id", "session-12"))
	if second.Label == LabelSessionMatch {
		t.Fatalf("session-12 matched session-1's entry")
	}
	if second.Worker == first.Worker {
		t.Fatalf("session-12 followed session-1 onto the busier worker %s", first.Worker.ID())
	}
	_ = ws
}

func TestUnknownSessionLandsOnHistoryHolderThenSticks(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(defaultOptions())
	turn1 := chat(longSystem, []string{"fix the bug in parser.go"}, "")
	placed := route(p, pool, req(t, turn1)) // no session id: placed by load
	turn2 := chat(longSystem, []string{"fix the bug in parser.go", "done", "now add a test"}, "")
	d := route(p, pool, req(t, turn2, "x-session-id", "s-new"))
	if d.Label != LabelFullHistoryMatch || d.Worker != placed.Worker {
		t.Fatalf("turn 2 of an unknown session: %s on %s, want %s on %s", d.Label, d.Worker.ID(), LabelFullHistoryMatch, placed.Worker.ID())
	}
	if d.Match <= 0.3 {
		t.Fatalf("predicted match %v, want above the threshold", d.Match)
	}
	turn3 := chat(longSystem, []string{"fix the bug in parser.go", "done", "now add a test", "added", "run it"}, "")
	d = route(p, pool, req(t, turn3, "x-session-id", "s-new"))
	if d.Label != LabelSessionMatch || d.Worker != placed.Worker {
		t.Fatalf("turn 3: %s on %s, want session_id_match on %s", d.Label, d.Worker.ID(), placed.Worker.ID())
	}
}

func TestChatWithoutIDsLandsOnHolderOfSystemPromptAndTools(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(defaultOptions())
	tools := `,"tools":[{"type":"function","function":{"name":"read_file","description":"` + strings.Repeat("Read a file from the workspace. ", 20) + `","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]`
	first := route(p, pool, req(t, chat(longSystem, []string{"first task"}, tools)))
	if first.Label != LabelLowMatch {
		t.Fatalf("first request: %s, want %s", first.Label, LabelLowMatch)
	}
	for i := range 5 {
		d := route(p, pool, req(t, chat(longSystem, []string{fmt.Sprintf("another task %d", i)}, tools)))
		if d.Label != LabelCacheAffinity || d.Worker != first.Worker {
			t.Fatalf("request %d: %s on %s, want cache_affinity on %s", i, d.Label, d.Worker.ID(), first.Worker.ID())
		}
	}
}

func TestImageOnlyChatWithUnknownSessionIsEmptyHistoryMinLoad(t *testing.T) {
	pool, ws := fleet(t, 3)
	p := newPolicy(defaultOptions())
	ws[0].Reserve()
	ws[2].Reserve()
	body := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	d := route(p, pool, req(t, body, "x-session-id", "img"))
	if d.Label != LabelEmptyHistory || d.Worker != ws[1] {
		t.Fatalf("%s on %s, want %s on the idle %s", d.Label, d.Worker.ID(), LabelEmptyHistory, ws[1].ID())
	}
}

func TestChangingRequestIDDoesNotChangeWorker(t *testing.T) {
	pool, _ := fleet(t, 8)
	p := newPolicy(defaultOptions())
	body := chat(longSystem, []string{"same conversation"}, "")
	first := route(p, pool, req(t, body, "x-request-id", "r-0"))
	for i := 1; i < 10; i++ {
		d := route(p, pool, req(t, body, "x-request-id", fmt.Sprintf("r-%d", i), "x-correlation-id", fmt.Sprint(i), "traceparent", fmt.Sprint(i)))
		if d.Worker != first.Worker || d.Label != LabelCacheAffinity {
			t.Fatalf("request %d: %s on %s, want cache_affinity on %s", i, d.Label, d.Worker.ID(), first.Worker.ID())
		}
	}
}

func TestHeaderAndBodySessionIDsReachTheSameSession(t *testing.T) {
	pool, _ := fleet(t, 8)
	p := newPolicy(defaultOptions())
	first := route(p, pool, req(t, chat("", []string{"a"}, ""), "x-session-id", "abc"))
	d := route(p, pool, req(t, chat("", []string{"completely different text"}, `,"session_params":{"session_id":"abc"}`)))
	if d.Label != LabelSessionMatch || d.Worker != first.Worker {
		t.Fatalf("body id: %s on %s, want session_id_match on %s", d.Label, d.Worker.ID(), first.Worker.ID())
	}
}

func TestBalanceGateOverridesSessionHitAndSessionFollows(t *testing.T) {
	pool, _ := fleet(t, 2)
	p := newPolicy(defaultOptions())
	body := chat("", []string{"hello"}, "")
	home := route(p, pool, req(t, body, "x-session-id", "s"))
	var leases []*workers.Lease
	for range 65 { // max-min = 65 > 64 and 65 > 0*1.5
		leases = append(leases, home.Worker.Reserve())
	}
	d := route(p, pool, req(t, body, "x-session-id", "s"))
	if d.Label != LabelLoadBalance || d.Worker == home.Worker {
		t.Fatalf("imbalanced: %s on %s, want load_balance away from %s", d.Label, d.Worker.ID(), home.Worker.ID())
	}
	for _, l := range leases {
		l.Release()
	}
	again := route(p, pool, req(t, body, "x-session-id", "s"))
	if again.Label != LabelSessionMatch || again.Worker != d.Worker {
		t.Fatalf("after the gate: %s on %s, want session_id_match on the new worker %s", again.Label, again.Worker.ID(), d.Worker.ID())
	}
}

func TestBalanceGateNeedsBothThresholds(t *testing.T) {
	pool, ws := fleet(t, 2)
	p := newPolicy(defaultOptions())
	body := chat("", []string{"hello"}, "")
	home := route(p, pool, req(t, body, "x-session-id", "s"))
	other := ws[0]
	if other == home.Worker {
		other = ws[1]
	}
	for range 100 { // the other worker at 100: home 164 would trip; home at 149 does not (not > 150)
		other.Reserve()
	}
	for range 149 {
		home.Worker.Reserve()
	}
	if d := route(p, pool, req(t, body, "x-session-id", "s")); d.Label != LabelSessionMatch {
		t.Fatalf("diff 49 within abs threshold: %s, want session_id_match", d.Label)
	}
}

func TestWorkerRemovalClearsSessionsAndTree(t *testing.T) {
	pool, _ := fleet(t, 2)
	p := newPolicy(defaultOptions())
	body := chat(longSystem, []string{"task"}, "")
	home := route(p, pool, req(t, body, "x-session-id", "s"))
	if heldBy(p, req(t, body), home.Worker.ID()) == 0 {
		t.Fatal("the chosen worker was not taught the history")
	}
	url := home.Worker.URL()
	if _, err := pool.Remove(url); err != nil {
		t.Fatal(err)
	}
	p.WorkerRemoved(url)
	if tenant, ok, _ := p.store.Get(context.Background(), "m", "session:s"); ok {
		t.Fatalf("session still points at %s", tenant)
	}
	if got := heldBy(p, req(t, body), home.Worker.ID()); got != 0 {
		t.Fatalf("removed worker still holds %d chars in the tree", got)
	}
	d := route(p, pool, req(t, body, "x-session-id", "s"))
	if d.Worker.URL() == url || d.Label == LabelSessionMatch {
		t.Fatalf("after removal: %s on %s", d.Label, d.Worker.ID())
	}
}

func TestUnhealthyHolderIsStaleAndForgotten(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	body := chat(longSystem, []string{"task"}, "")
	holder := route(p, pool, req(t, body)).Worker
	holder.SetHealthy(false)
	d := route(p, pool, req(t, body))
	if d.Label != LabelFirstHealthyFallback || d.Worker == holder {
		t.Fatalf("no session: %s on %s", d.Label, d.Worker.ID())
	}
	if heldBy(p, req(t, body), holder.ID()) != 0 {
		t.Fatal("stale holder kept in the tree")
	}
	// With a session key: the history's holder is gone.
	body2 := chat(longSystem, []string{"task two"}, "")
	holder2 := route(p, pool, req(t, body2)).Worker
	holder2.SetHealthy(false)
	if d := route(p, pool, req(t, body2, "x-session-id", "fresh")); d.Label != LabelStaleTenant || d.Worker == holder2 {
		t.Fatalf("session miss with stale holder: %s on %s", d.Label, d.Worker.ID())
	}
}

func TestSessionOnUnhealthyWorkerIsDroppedAndReplaced(t *testing.T) {
	pool, _ := fleet(t, 3)
	p := newPolicy(defaultOptions())
	home := route(p, pool, req(t, chat("", []string{"x"}, ""), "x-session-id", "s")).Worker
	home.SetHealthy(false)
	d := route(p, pool, req(t, chat("", []string{"x"}, ""), "x-session-id", "s"))
	if d.Worker == home || d.Label == LabelSessionMatch {
		t.Fatalf("%s on %s", d.Label, d.Worker.ID())
	}
	if tenant, _, _ := p.store.Get(context.Background(), "m", "session:s"); tenant != d.Worker.ID() {
		t.Fatalf("session points at %q, want the new worker %s", tenant, d.Worker.ID())
	}
}

func TestLowMatchAndCompletionLabels(t *testing.T) {
	pool, _ := fleet(t, 2)
	p := newPolicy(defaultOptions())
	prompt := `{"model":"m","prompt":"` + strings.Repeat("once upon a time ", 50) + `"}`
	first := route(p, pool, req(t, prompt, "x-session-id", "ignored-for-completions"))
	if first.Label != LabelLowMatch {
		t.Fatalf("first completion: %s", first.Label)
	}
	if d := route(p, pool, req(t, prompt)); d.Label != LabelCacheAffinity || d.Worker != first.Worker {
		t.Fatalf("repeated completion: %s on %s", d.Label, d.Worker.ID())
	}
	// A chat whose history shares too little with anything cached.
	d := route(p, pool, req(t, chat("", []string{"unrelated"}, ""), "x-session-id", "new"))
	if d.Label != LabelHistoryLowMatch {
		t.Fatalf("unmatched history: %s", d.Label)
	}
}

func TestMinLoadTiesAreSpreadNotByIndex(t *testing.T) {
	pool, ws := fleet(t, 4)
	p := newPolicy(defaultOptions())
	counts := map[*workers.Worker]int{}
	for i := range 400 {
		_ = i // unrelated texts: nothing cached matches them, every pick is a min-load tie
		counts[route(p, pool, req(t, chat("", []string{fmt.Sprintf("%016x", rand.Uint64())}, ""))).Worker]++
	}
	for _, w := range ws {
		if counts[w] < 40 {
			t.Fatalf("idle ties are not spread: %v", counts)
		}
	}
	// With session keys, ties are broken by the rendezvous hash of the key: spread over keys, and
	// the same key always lands on the same idle worker.
	counts = map[*workers.Worker]int{}
	for i := range 400 {
		key := fmt.Sprintf("sess-%d", i)
		a, b := newPolicy(defaultOptions()), newPolicy(defaultOptions()) // two replicas, no shared state
		d1 := route(a, pool, req(t, chat("", []string{"x"}, ""), "x-session-id", key))
		d2 := route(b, pool, req(t, chat("", []string{"x"}, ""), "x-session-id", key))
		if d1.Worker != d2.Worker {
			t.Fatalf("two routers placed %s differently: %s vs %s", key, d1.Worker.ID(), d2.Worker.ID())
		}
		counts[d1.Worker]++
	}
	for _, w := range ws {
		if counts[w] < 40 {
			t.Fatalf("session placements not spread: %v", counts)
		}
	}
}

func TestSessionTTLAndCapacityKeepTheNewest(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := session.NewMemory(session.MemoryOptions{TTL: time.Minute, MaxEntries: 2, Now: clock})
	opts := defaultOptions()
	opts.Store = store
	pool, _ := fleet(t, 2)
	p := newPolicy(opts)
	body := chat("", []string{"x"}, "")
	for _, id := range []string{"old", "mid", "new"} {
		route(p, pool, req(t, body, "x-session-id", id))
		mu.Lock()
		now = now.Add(20 * time.Second)
		mu.Unlock()
	}
	ctx := context.Background()
	if _, ok, _ := store.Get(ctx, "m", "session:old"); ok {
		t.Fatal("capacity 2 kept the oldest session")
	}
	if _, ok, _ := store.Get(ctx, "m", "session:new"); !ok {
		t.Fatal("capacity eviction dropped the newest session")
	}
	mu.Lock()
	now = now.Add(50 * time.Second) // "mid" was last used 70s ago, "new" (read above) 50s ago
	mu.Unlock()
	if _, ok, _ := store.Get(ctx, "m", "session:mid"); ok {
		t.Fatal("expired session still served")
	}
	if _, ok, _ := store.Get(ctx, "m", "session:new"); !ok {
		t.Fatal("TTL dropped the newest session")
	}
}

func TestTreeBudgetHoldsUnderLongRandomWorkload(t *testing.T) {
	opts := defaultOptions()
	opts.MaxTreeSize = 64 << 10
	pool, _ := fleet(t, 4)
	p := newPolicy(opts)
	rng := rand.New(rand.NewPCG(1, 2))
	histories := make([][]string, 50)
	for i := range 3000 {
		s := rng.IntN(len(histories))
		histories[s] = append(histories[s], strings.Repeat(fmt.Sprintf("s%d-t%d ", s, len(histories[s])), 1+rng.IntN(40)))
		route(p, pool, req(t, chat("shared system", histories[s], ""), "x-session-id", fmt.Sprint(s)))
		if got := p.TreeBytes(); got > opts.MaxTreeSize*11/10 {
			t.Fatalf("after request %d the tree holds %d bytes, over 1.1x the budget %d", i, got, opts.MaxTreeSize)
		}
		if len(histories[s]) > 30 {
			histories[s] = nil
		}
	}
	p.Sweep()
	if got := p.TreeBytes(); got > opts.MaxTreeSize {
		t.Fatalf("after a sweep the tree holds %d bytes, over the budget %d", got, opts.MaxTreeSize)
	}
}

func TestStateIsPerModel(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(defaultOptions())
	a := route(p, pool, req(t, `{"model":"a","messages":[{"role":"user","content":"x"}]}`, "x-session-id", "s"))
	b := route(p, pool, req(t, `{"model":"b","messages":[{"role":"user","content":"x"}]}`, "x-session-id", "s"))
	if a.Label == LabelSessionMatch || b.Label == LabelSessionMatch {
		t.Fatalf("a session of model a served a request of model b: %s, %s", a.Label, b.Label)
	}
	d := route(p, pool, req(t, `{"messages":[{"role":"user","content":"x"}]}`, "x-session-id", "s"))
	if d.Label == LabelSessionMatch {
		t.Fatal("a request without model shared state with a named model")
	}
	if got := p.Sessions(); len(got) != 3 || got["a"] != 1 || got["b"] != 1 || got[DefaultModel] != 1 {
		t.Fatalf("sessions per model %v, want one each for a, b and default", got)
	}
}

func TestParallelRequestsOnOneSession(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(defaultOptions())
	first := route(p, pool, req(t, chat(longSystem, []string{"turn"}, ""), "x-session-id", "shared"))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				d := route(p, pool, req(t, chat(longSystem, []string{"turn", "reply", fmt.Sprintf("g%d-%d", g, i)}, ""), "x-session-id", "shared"))
				if d.Worker != first.Worker || d.Label != LabelSessionMatch {
					t.Errorf("%s on %s", d.Label, d.Worker.ID())
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestNewConversationsOnASharedPromptSpreadByLoad(t *testing.T) {
	pool, _ := fleet(t, 4)
	p := newPolicy(defaultOptions())
	first := route(p, pool, req(t, chat(longSystem, []string{"task one"}, ""), "x-session-id", "one"))
	// A second conversation on the prompt looks like a continuation of the only one there.
	if d := route(p, pool, req(t, chat(longSystem, []string{"task zero"}, ""), "x-session-id", "zero")); d.Worker != first.Worker {
		t.Fatalf("second conversation: %s on %s", d.Label, d.Worker.ID())
	}
	lease := first.Worker.Reserve() // turn 1 of session one is still running
	defer lease.Release()
	d := route(p, pool, req(t, chat(longSystem, []string{"task two"}, ""), "x-session-id", "two"))
	if d.Worker == first.Worker || d.Label != LabelHistoryLowMatch {
		t.Fatalf("a new session sharing only the system prompt: %s on %s, want %s on an idle worker",
			d.Label, d.Worker.ID(), LabelHistoryLowMatch)
	}
	// Without session ids the same holds (the idle holder of the prompt, session two's worker,
	// is preferred to idle workers that would prefill it), and each conversation then stays where
	// it started.
	n := route(p, pool, req(t, chat(longSystem, []string{"task three"}, "")))
	if n.Worker != d.Worker || n.Label != LabelCacheAffinity {
		t.Fatalf("a new conversation without id: %s on %s, want cache_affinity on the idle holder %s", n.Label, n.Worker.ID(), d.Worker.ID())
	}
	for range 3 {
		defer n.Worker.Reserve().Release() // busier than the others, below the gate
	}
	next := route(p, pool, req(t, chat(longSystem, []string{"task three", "done", "next step"}, "")))
	if next.Worker != n.Worker || next.Label != LabelCacheAffinity {
		t.Fatalf("turn 2 of that conversation: %s on %s, want cache_affinity on %s", next.Label, next.Worker.ID(), n.Worker.ID())
	}
}
