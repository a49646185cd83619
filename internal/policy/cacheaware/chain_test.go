package cacheaware

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/prefixtree"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Labels lists every label a decision can carry, each once: the chain's, those of a turn that
// continues a stored response, and those of the pressure-aware placement.
func TestLabelsAreEveryLabelOfEveryPathOnce(t *testing.T) {
	want := []string{LabelResponseMatch, LabelResponseGone, LabelResponseUnavailable, LabelLoadBalance,
		LabelSessionMatch, LabelSessionEvicted, LabelFullHistoryMatch, LabelStaleTenant, LabelHistoryLowMatch,
		LabelEmptyHistory, LabelCacheAffinity, LabelLowMatch, LabelFirstHealthyFallback, LabelKVEventsMatch,
		LabelSessionMoved, LabelKVRoom, LabelKVRoomWaited, LabelKVRoomExhausted}
	got := newPolicy(defaultOptions()).Labels()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Labels() = %q\nwant %q", got, want)
	}
}

func TestEveryStepHasItsOwnNameAndDeclaresItsLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range chain {
		if s.name == "" || seen[s.name] || len(s.labels) == 0 {
			t.Fatalf("step %q: a name used twice, or no name, or no labels (%q)", s.name, s.labels)
		}
		seen[s.name] = true
	}
}

// stepLog records the step each decision logged.
type stepLog struct {
	mu    sync.Mutex
	steps []string
}

func (h *stepLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *stepLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *stepLog) WithGroup(string) slog.Handler            { return h }
func (h *stepLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "step" {
			h.mu.Lock()
			h.steps = append(h.steps, a.Value.String())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func (h *stepLog) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.steps) == 0 {
		return ""
	}
	return h.steps[len(h.steps)-1]
}

// stepFor returns the step of chain called name.
func stepFor(t *testing.T, name string) step {
	t.Helper()
	for _, s := range chain {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no step %q", name)
	return step{}
}

// Each reason a label is given for is a step of its own: the decision's log names the step, and
// the label is one the step declares. low_match_min_load, for one, is given by four steps.
func TestEachReasonIsNamedByTheStepThatDecided(t *testing.T) {
	image := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	// Two conversations of one agent on the first worker, so that its system prompt is a
	// prefix the tree's conversations share; then a third conversation of it.
	shared := func(t *testing.T, p *Policy, pool *workers.Pool) {
		route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
		route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
		for _, w := range pool.All() {
			w.Reserve() // every other worker busier than the first
		}
		first := route(p, pool, req(t, chat(longSystem, []string{"task two"}, "")))
		for _, w := range pool.All() {
			if w != first.Worker {
				w.Reserve()
			}
		}
	}
	// sharedThenGone is shared, after which every worker holding the system prompt leaves.
	sharedThenGone := func(t *testing.T, p *Policy, pool *workers.Pool) {
		shared(t, p, pool)
		for _, w := range pool.All() {
			if heldBy(p, req(t, chat(longSystem, []string{"x"}, "")), w.ID()) > 0 {
				w.SetHealthy(false)
			}
		}
	}
	third := func(t *testing.T, p *Policy, pool *workers.Pool, header ...string) policy.Decision {
		return route(p, pool, req(t, chat(longSystem, []string{"task three"}, ""), header...))
	}
	cases := []struct {
		name, step, label string
		opts              func(*Options)
		decide            func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision
	}{
		{name: "imbalanced", step: "balance_gate", label: LabelLoadBalance,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				for range 65 {
					ws[0].Reserve()
				}
				return route(p, pool, req(t, chat("", []string{"hello"}, "")))
			}},
		{name: "known session", step: "session_map", label: LabelSessionMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				route(p, pool, req(t, chat("", []string{"hello"}, ""), "x-session-id", "s"))
				return route(p, pool, req(t, chat("", []string{"something else"}, ""), "x-session-id", "s"))
			}},
		{name: "the session's worker evicted it", step: "session_evicted", label: LabelSessionEvicted,
			opts: func(o *Options) { o.KVIndex = kvevents.NewIndex(1 << 20) },
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				x, prompt := p.opts.KVIndex, tokens(1000, 3*16)
				store(x, ws[1].ID(), prompt, 3, 0)
				store(x, ws[1].ID(), tokens(9000, 16), 1, 50) // the engine holds something else still
				in := withTokens(policy.Input{Request: req(t, chat("", []string{"hello"}, ""), "x-session-id", "s1"),
					Candidates: pool.All(), All: pool.All()}, prompt, "")
				p.Accepted(in, policy.Decision{Worker: ws[1], Label: LabelFullHistoryMatch})
				x.Apply(ws[1].ID(), "", kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.Removed, BlockHashes: []kvevents.Hash{1, 2, 3}}}})
				d, _ := sessionTurn(t, p, pool, prompt)
				return d
			}},
		{name: "engines hold the prompt", step: "kv_events", label: LabelKVEventsMatch,
			opts: func(o *Options) { o.KVIndex = kvevents.NewIndex(1 << 20) },
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				store(p.opts.KVIndex, ws[1].ID(), tokens(0, 64), 4, 0)
				return selectWith(t, p, pool, tokens(0, 64))
			}},
		{name: "no engine holds the prompt, events alone", step: "no_engine_holds_any", label: LabelLowMatch,
			opts: func(o *Options) { o.KVIndex, o.CacheIndex = kvevents.NewIndex(1<<20), IndexEvents },
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				store(p.opts.KVIndex, ws[1].ID(), tokens(0, 64), 4, 0)
				return selectWith(t, p, pool, tokens(5000, 64))
			}},
		{name: "unknown session without text", step: "empty_history", label: LabelEmptyHistory,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				return route(p, pool, req(t, image, "x-session-id", "img"))
			}},
		{name: "no session key, no text", step: "no_text", label: LabelLowMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				return route(p, pool, req(t, image))
			}},
		{name: "nothing cached", step: "text_too_little_cached", label: LabelLowMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				return route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
			}},
		{name: "the same request again", step: "text_continued", label: LabelCacheAffinity,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
				return route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
			}},
		{name: "its holder left", step: "text_continued", label: LabelFirstHealthyFallback,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				first := route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
				first.Worker.SetHealthy(false)
				return route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
			}},
		{name: "a shared prefix, its holder gone", step: "text_holders_gone", label: LabelFirstHealthyFallback,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				sharedThenGone(t, p, pool)
				return third(t, p, pool)
			}},
		{name: "a shared prefix, its holder gone, unknown session", step: "session_history_holders_gone", label: LabelStaleTenant,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				sharedThenGone(t, p, pool)
				return third(t, p, pool, "x-session-id", "new")
			}},
		{name: "a shared prefix, cost mode", step: "text_by_cost", label: LabelCacheAffinity,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				shared(t, p, pool)
				return third(t, p, pool)
			}},
		{name: "a shared prefix, threshold mode", step: "text_by_load", label: LabelCacheAffinity,
			opts: func(o *Options) { o.HistoryMatchMode = HistoryThreshold },
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				shared(t, p, pool)
				return third(t, p, pool)
			}},
		{name: "a shared prefix, unknown session", step: "session_history_by_cost", label: LabelFullHistoryMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				shared(t, p, pool)
				return third(t, p, pool, "x-session-id", "new")
			}},
		{name: "an unknown session's history, cached", step: "session_history_continued", label: LabelFullHistoryMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				route(p, pool, req(t, chat(longSystem, []string{"task one"}, "")))
				return route(p, pool, req(t, chat(longSystem, []string{"task one", "done", "next"}, ""), "x-session-id", "new"))
			}},
		{name: "an unknown session's history, nothing cached", step: "session_history_too_little_cached", label: LabelHistoryLowMatch,
			decide: func(t *testing.T, p *Policy, pool *workers.Pool, ws []*workers.Worker) policy.Decision {
				return route(p, pool, req(t, chat(longSystem, []string{"task one"}, ""), "x-session-id", "new"))
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pool, ws := fleet(t, 3)
			opts := defaultOptions()
			if c.opts != nil {
				c.opts(&opts)
			}
			log := &stepLog{}
			p := New(opts, nil, slog.New(log))
			d := c.decide(t, p, pool, ws)
			if got := log.last(); got != c.step || d.Label != c.label {
				t.Fatalf("decided by %s with %s, want %s with %s", got, d.Label, c.step, c.label)
			}
			if !slices.Contains(stepFor(t, c.step).labels, d.Label) {
				t.Fatalf("step %s gave %s, which it does not declare (%q)", c.step, d.Label, stepFor(t, c.step).labels)
			}
		})
	}
}

// In a fleet of more tenants than a probe keeps inside itself, every worker holds the agent's
// system prompt, and each conversation still follows the worker that holds it.
func TestALargeFleetFollowsEachConversation(t *testing.T) {
	pool, _ := fleet(t, prefixtree.ProbeInline+4)
	p := newPolicy(defaultOptions())
	turn := func(i int, more ...string) string {
		return chat(longSystem, append([]string{fmt.Sprintf("task %d", i)}, more...), "")
	}
	placed := map[int]*workers.Worker{}
	for i := range 2 * len(pool.All()) {
		d := route(p, pool, req(t, turn(i)))
		d.Worker.Reserve() // the conversation runs on: the next goes to an idler worker
		placed[i] = d.Worker
	}
	var pr prefixtree.Probe
	if p.tree.Probe(&pr, "m", req(t, turn(0)).Text, nil); len(pr.Holds()) <= prefixtree.ProbeInline {
		t.Fatalf("%d workers hold the system prompt: the probe keeps them all inside itself", len(pr.Holds()))
	}
	for i := range placed {
		if d := route(p, pool, req(t, turn(i, "done", "next"))); d.Worker != placed[i] || d.Label != LabelCacheAffinity {
			t.Fatalf("conversation %d: %s on %s, want %s on %s", i, d.Label, d.Worker.Name(), LabelCacheAffinity, placed[i].Name())
		}
	}
}
