package cacheaware

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// promptSizes are the conversation sizes an agent sends, from a short chat to a long coding
// session.
var promptSizes = []struct {
	name string
	size int
}{{"4KB", 4 << 10}, {"100KB", 100 << 10}, {"400KB", 400 << 10}, {"1MB", 1 << 20}}

// The ways a turn reaches the policy: with a session id (ids); without any id, placed by the
// prefix tree (noids); without any id, with its prompt tokens, matched against the engines'
// KV-cache events (noids_events).
const (
	modeIDs       = "ids"
	modeNoIDs     = "noids"
	modeNoIDsEvts = "noids_events"
)

var sizeModes = []string{modeIDs, modeNoIDs, modeNoIDsEvts}

// conversationTurns is how many turns each benchmarked conversation has; its first turn is sent
// untimed, so that every timed turn continues what the policy already holds.
const conversationTurns = 8

// eventBlockSize is the engines' KV block, in tokens, as vLLM's default.
const eventBlockSize = 16

// agentConversation is one agent conversation of about size bytes: a system prompt every
// conversation shares, the conversation's own task, then each turn appends an assistant reply and
// a tool result to the previous turn, as an agent loop resends its history.
type agentConversation struct {
	bodies [][]byte // the chat body of each turn
	// tokens are the last turn's prompt tokens; turn t's are their first tokenCount(bodies[t]),
	// so each turn's tokens extend the previous turn's, as an engine's would.
	tokens []uint32
}

// tokenCount is the prompt tokens of a body, at reqkey.BytesPerToken.
func tokenCount(body []byte) int { return len(body) / reqkey.BytesPerToken }

// newAgentConversation builds conversation number n of the given size. The turns grow by
// turnGrowth(size) each, the middle turn at size.
func newAgentConversation(n, size int) agentConversation {
	shared := rand.New(rand.NewPCG(1, 1))
	own := rand.New(rand.NewPCG(2, uint64(n)))
	system := prose(shared, size/8)
	step := turnGrowth(size)
	task := fmt.Sprintf("conversation %d: ", n)
	task += prose(own, max(size-size/8-conversationTurns/2*step-len(task), 64))
	turns := []string{task}
	var c agentConversation
	for t := range conversationTurns {
		if t > 0 {
			turns = append(turns, prose(own, step/2), prose(own, step/2))
		}
		c.bodies = append(c.bodies, []byte(chat(system, turns, "")))
	}
	sysTokens := len(system) / reqkey.BytesPerToken
	c.tokens = make([]uint32, tokenCount(c.bodies[len(c.bodies)-1]))
	for i := range c.tokens {
		c.tokens[i] = uint32(i) // the system prompt's tokens are every conversation's
		if i >= sysTokens {
			c.tokens[i] = uint32(n+1)*2654435761 + uint32(i)
		}
	}
	return c
}

// turnGrowth is what each turn appends at a conversation size: a little (1/32 of it, at most
// 2 KiB, at least 128 bytes).
func turnGrowth(size int) int { return min(max(size/32, 128), 2<<10) }

// prose is n bytes of words.
func prose(rng *rand.Rand, n int) string {
	words := strings.Fields("the agent reads the file then runs the tests and edits the function until the build is green again while the router keeps its cache warm")
	var sb strings.Builder
	sb.Grow(n + 16)
	for sb.Len() < n {
		sb.WriteString(words[rng.IntN(len(words))])
		sb.WriteByte(' ')
	}
	return sb.String()[:n]
}

// BenchmarkDecisionBySize is one whole decision for a turn of an agent conversation, as the proxy
// drives the policy: parse the body, ask for the prompt tokens when the events are on
// (the policy asks its tokenizer; the tokens themselves are given, their /tokenize is the router's
// to measure) in Select, then Accepted and Done, over 8 workers. Each timed turn continues the previous turn of its
// conversation, which the policy already holds (the tree, the session map, and with events the
// engine's blocks of the previous turn in the index). Sizes and modes as promptSizes and
// sizeModes:
//
//	go test ./internal/policy/cacheaware/ -run '^$' -bench DecisionBySize -benchtime 20x
func BenchmarkDecisionBySize(b *testing.B) {
	for _, sz := range promptSizes {
		for _, mode := range sizeModes {
			b.Run("size="+sz.name+"/mode="+mode, func(b *testing.B) { benchDecisionBySize(b, sz.size, mode) })
		}
	}
}

func benchDecisionBySize(b *testing.B, size int, mode string) {
	pool, _ := fleet(b, 8)
	env := policy.Env{LoadUnitTokens: workers.DefaultLoadUnitTokens, SessionTTL: time.Hour, MaxSessions: 100_000}
	tk := &tokenizer{}           // the conversation's tokens, given to the policy when it asks
	memo := &policy.PromptMemo{} // each turn's, made afresh as the proxy's exchange holds one
	var index *kvevents.Index
	if mode == modeNoIDsEvts {
		index = kvevents.NewIndex(64 << 20)
		env.KVIndex, env.Tokenizer = index, tk
	}
	p := newPolicy(DefaultKnobs().Options(env))
	want := map[string]string{modeIDs: LabelSessionMatch, modeNoIDs: LabelCacheAffinity, modeNoIDsEvts: LabelKVEventsMatch}[mode]

	var conv agentConversation
	var holder tenant.ID // the worker whose engine holds the conversation's first blocks
	held := 0            // how many
	var header http.Header
	turn := func(n, t int) {
		body := conv.bodies[t]
		r, err := protocol.ParseChat(header, body)
		if err != nil {
			b.Fatal(err)
		}
		prompt := tokenCount(body)
		tk.tokens = conv.tokens[:prompt]
		*memo = policy.PromptMemo{}
		in := policy.Input{Context: b.Context(), Request: r, Model: r.Model, Candidates: pool.All(), All: pool.All(), Size: len(body),
			Body: body, Prompt: memo}
		d := p.Select(in)
		if d.Worker == nil {
			b.Fatalf("conversation %d turn %d: no worker (%s)", n, t, d.Label)
		}
		p.Accepted(in, d)
		p.Done(in, d, workers.Succeeded, policy.Usage{Prompt: prompt, Output: 64})
		if t > 0 && d.Label != want {
			b.Fatalf("conversation %d turn %d: %s, want %s", n, t, d.Label, want)
		}
		if index != nil { // the engine stores the blocks the turn added, and says so
			b.StopTimer()
			if d.Worker.ID() != holder {
				holder, held = d.Worker.ID(), 0
			}
			held = storeTurn(index, holder, n, conv.tokens[:prompt], held)
			b.StartTimer()
		}
	}

	b.SetBytes(int64(size))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n, t := i/(conversationTurns-1), 1+i%(conversationTurns-1)
		if t == 1 { // a new conversation: its first turn teaches, untimed
			b.StopTimer()
			conv, holder, held = newAgentConversation(n, size), "", 0
			header = nil
			if mode == modeIDs {
				header = http.Header{"X-Session-Id": {fmt.Sprintf("conversation-%d", n)}}
			}
			turn(n, 0)
			b.StartTimer()
		}
		turn(n, t)
		i++
	}
}

// storeTurn applies worker's BlockStored event for the full blocks of tokens past the first held
// ones, chained to them, as an engine publishes what a turn added to its cache, and returns the
// blocks it now holds. Block j of conversation n has hash n<<32 + j + 1.
func storeTurn(index *kvevents.Index, worker tenant.ID, n int, tokens []uint32, held int) int {
	full := len(tokens) / eventBlockSize
	if full <= held {
		return held
	}
	hash := func(j int) kvevents.Hash { return kvevents.Hash(uint64(n)<<32 + uint64(j) + 1) }
	e := kvevents.Event{Kind: kvevents.Stored, BlockSize: eventBlockSize, TokenIDs: tokens[held*eventBlockSize : full*eventBlockSize]}
	if held > 0 {
		e.Parent, e.HasParent = hash(held-1), true
	}
	for j := held; j < full; j++ {
		e.BlockHashes = append(e.BlockHashes, hash(j))
	}
	index.Apply(worker, "", kvevents.Batch{Events: []kvevents.Event{e}})
	return full
}
