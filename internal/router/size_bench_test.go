package router

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/proxy"
)

// BenchmarkProxyBySize is one whole proxied request of an agent conversation at sizes from 4 KB
// to 1 MB: a chat completion sent over loopback HTTP to a cache_aware router in front of two
// loopback workers, answered and read back. Each timed request is the next turn of the
// conversation its previous turn began (that turn plus an assistant reply and a tool result), so
// the router already holds the previous turn. Per size, the modes:
//
//   - ids: every turn carries its conversation's x-session-id;
//   - noids: no id at all, the prefix tree places the turn;
//   - noids_events: no id, the workers publish their engines' KV-cache events and the router
//     subscribes, so it asks a worker's /tokenize for each turn's prompt and places it by the
//     blocks its engine reported holding (the previous turn's);
//   - direct: the same turns sent straight to a worker, without the router: the share of ns/op
//     and B/op that is the client's and the worker's, since the whole loop runs in one process.
//
// The workers cost next to nothing (sizeWorker), so what the figures hold beyond direct's is the
// router's. Besides allocations it reports the mean request body (body-B/op) and, with events,
// the /tokenize calls per request. The decision each timed turn got is checked (session_id_match,
// cache_affinity, kv_events_match), so that a mode measures the path it names:
//
//	go test ./internal/router/ -run '^$' -bench ProxyBySize -benchtime 20x
func BenchmarkProxyBySize(b *testing.B) {
	for _, sz := range []struct {
		name string
		size int
	}{{"4KB", 4 << 10}, {"100KB", 100 << 10}, {"400KB", 400 << 10}, {"1MB", 1 << 20}} {
		for _, mode := range []string{"ids", "noids", "noids_events", "direct"} {
			b.Run("size="+sz.name+"/mode="+mode, func(b *testing.B) { benchProxyBySize(b, sz.size, mode) })
		}
	}
}

// sizeTurns is how many turns each conversation of BenchmarkProxyBySize has; the first is sent
// untimed, so that each timed turn continues one the router has seen.
const sizeTurns = 8

func benchProxyBySize(b *testing.B, size int, mode string) {
	events := mode == "noids_events"
	var current atomic.Pointer[sizeTurn]
	ws := []*sizeWorker{newSizeWorker(b, &current, events), newSizeWorker(b, &current, events)}
	byURL := map[string]*sizeWorker{}
	front := ws[0].url // direct
	var r *Router
	if mode != "direct" {
		cfg := testConfig()
		cfg.Policy = "cache_aware"
		cfg.TokenizeTimeoutSecs = 10 // the whole /tokenize round trip is measured, never cut short
		cfg.KVEventsWorkerEndpoints = map[string]string{}
		for _, w := range ws {
			cfg.WorkerURLs = append(cfg.WorkerURLs, w.url)
			byURL[w.url] = w
			if events {
				cfg.KVEventsWorkerEndpoints[w.url] = w.pub.Endpoint
			}
		}
		var err error
		if r, err = New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			b.Fatal(err)
		}
		r.Start(b.Context())
		front = serveForBench(b, r)
		if events {
			for _, w := range ws {
				w.joinStream(b, r)
			}
		}
	}
	want := map[string]string{"ids": "session_id_match", "noids": "cache_affinity", "noids_events": "kv_events_match"}[mode]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	var session string
	send := func(turn *sizeTurn, timed bool) {
		current.Store(turn)
		req, err := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", bytes.NewReader(turn.body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if mode == "ids" {
			req.Header.Set("X-Session-Id", session)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("conversation %d: status %d: %s", turn.conversation, resp.StatusCode, answer)
		}
		if timed && want != "" && resp.Header.Get(proxy.HeaderDecision) != want {
			b.Fatalf("conversation %d: %s, want %s", turn.conversation, resp.Header.Get(proxy.HeaderDecision), want)
		}
		if events { // the engine's events of this turn in the index before the next turn, untimed
			if timed {
				b.StopTimer()
				defer b.StartTimer()
			}
			byURL[resp.Header.Get(proxy.HeaderWorker)].awaitIndexed(b, r)
		}
	}

	var turns []*sizeTurn
	var body int64
	calls := 0.0
	if events {
		calls = tokenizeCalls(b, r)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		n, t := i/(sizeTurns-1), 1+i%(sizeTurns-1)
		if t == 1 { // a new conversation, begun untimed
			b.StopTimer()
			turns, session = sizeConversation(n, size), fmt.Sprintf("conversation-%d", n)
			if events {
				calls -= tokenizeCalls(b, r)
			}
			send(turns[0], false)
			if events {
				calls += tokenizeCalls(b, r)
			}
			b.StartTimer()
		}
		send(turns[t], true)
		body += int64(len(turns[t].body))
		i++
	}
	b.StopTimer()
	b.SetBytes(body / int64(i))
	b.ReportMetric(float64(body)/float64(i), "body-B/op")
	if events {
		b.ReportMetric((tokenizeCalls(b, r)-calls)/float64(i), "tokenize/op")
	}
}

// sizeTurn is one turn of a conversation, with what a worker answers for it.
type sizeTurn struct {
	conversation int
	body         []byte
	// tail is the end of the turn's last message: the chat the router forwards and the /tokenize
	// it asks must both carry it near their end.
	tail []byte
	// tokenized is the worker's /tokenize answer: one token per 4 bytes of body; each turn's
	// tokens extend the previous turn's.
	tokenized []byte
	// from and blocks are the full KV blocks of the previous turn's prompt and of this one;
	// stored is the engine's BlockStored batch of the blocks between (nil when none).
	from, blocks int
	stored       []byte
	answer       []byte // the chat completion, with its usage
}

// sizeConversation builds conversation n of about size bytes: a system prompt every conversation
// shares (an eighth of size), the conversation's own task, then per turn an assistant reply and
// a tool result of together min(max(size/32, 128), 2 KiB) bytes; the middle turn is size bytes.
func sizeConversation(n, size int) []*sizeTurn {
	words := []string{"grep", "the", "build", "failed", "in", "package", "router", "so", "we", "read", "its", "test", "log", "and", "retry"}
	rng := rand.New(rand.NewPCG(5, uint64(n)))
	text := func(r *rand.Rand, n int) []byte {
		out := make([]byte, 0, n+8)
		for len(out) < n {
			out = append(append(out, words[r.IntN(len(words))]...), ' ')
		}
		return out[:n]
	}
	system := text(rand.New(rand.NewPCG(5, 5)), size/8)
	step := min(max(size/32, 128), 2<<10)
	head := fmt.Appendf(nil, `{"model":"m","max_tokens":256,"messages":[{"role":"system","content":%q},`, system)
	msgs := fmt.Appendf(nil, `{"role":"user","content":"conversation %d: %s"}`, n, text(rng, size-size/8-sizeTurns/2*step))
	systemTokens := len(head) / 4
	var turns []*sizeTurn
	from := 0
	for t := range sizeTurns {
		var last []byte
		if t > 0 {
			last = text(rng, step/2)
			msgs = fmt.Appendf(msgs, `,{"role":"assistant","content":%q},{"role":"user","content":%q}`, text(rng, step/2), last)
		}
		body := append(append(append([]byte(nil), head...), msgs...), "]}"...)
		tail := body[len(body)-64 : len(body)-len(`"}]}`)]
		if t > 0 {
			tail = last[len(last)-48:]
		}
		tokens := make([]int, len(body)/4)
		ids := strconv.AppendInt([]byte(`{"count":`), int64(len(tokens)), 10)
		ids = append(ids, `,"max_model_len":1048576,"tokens":[`...)
		for i := range tokens {
			tokens[i] = (i*7919)%150_000 + 1 // the shared system prompt's tokens are every conversation's
			if i >= systemTokens {
				tokens[i] = (i*7919+(n+1)*104_729)%150_000 + 1
			}
			if i > 0 {
				ids = append(ids, ',')
			}
			ids = strconv.AppendInt(ids, int64(tokens[i]), 10)
		}
		turn := &sizeTurn{conversation: n, body: body, tail: tail, tokenized: append(ids, "]}"...),
			from: from, blocks: len(tokens) / 16,
			answer: fmt.Appendf(nil, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`, len(tokens), len(tokens)+1)}
		if turn.blocks > from {
			turn.stored = storedSince(n, tokens, from, turn.blocks)
		}
		from = turn.blocks
		turns = append(turns, turn)
	}
	return turns
}

// storedSince is an engine's BlockStored batch of blocks from … to of conversation n's tokens, in
// blocks of 16, chained to block from-1; block j has hash (n+1)<<32 + j.
func storedSince(n int, tokens []int, from, to int) []byte {
	hash := func(j int) int64 { return int64(n+1)<<32 + int64(j) }
	hashes := make([]any, 0, to-from)
	for j := from; j < to; j++ {
		hashes = append(hashes, hash(j))
	}
	var parent any
	if from > 0 {
		parent = hash(from - 1)
	}
	out, err := msgpack.Marshal([]any{2.5, []any{[]any{"BlockStored", hashes, parent, tokens[from*16 : to*16], 16, nil, "GPU", nil, nil}}, nil})
	if err != nil {
		panic(err) // plain values: it cannot fail
	}
	return out
}

// sizeWorker is a worker that costs BenchmarkProxyBySize next to nothing, so that what it
// measures is the router's: it answers the turn the benchmark is sending (current) with answers
// prepared beforehand, a chat with a small completion and /tokenize with the turn's tokens, once
// it has checked that the request carries that turn. With events, its engine publishes the blocks
// each chat added to its cache before the answer, as an engine does once it has prefilled them.
type sizeWorker struct {
	url     string
	current *atomic.Pointer[sizeTurn]
	pub     *kvtest.Publisher // nil without events

	mu         sync.Mutex
	buf        bytes.Buffer // the request read, reused
	engineConv int          // the conversation whose first engineHeld blocks the engine holds
	engineHeld int

	base      int          // blocks the router indexed from this worker before the benchmark
	published atomic.Int64 // blocks published since
}

func newSizeWorker(b *testing.B, current *atomic.Pointer[sizeTurn], events bool) *sizeWorker {
	w := &sizeWorker{current: current, engineConv: -1}
	if events {
		w.pub = kvtest.New(b, "", false)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})
	mux.HandleFunc("POST /tokenize", func(rw http.ResponseWriter, r *http.Request) {
		w.answer(rw, r, func(turn *sizeTurn) []byte { return turn.tokenized })
	})
	mux.HandleFunc("POST /v1/chat/completions", func(rw http.ResponseWriter, r *http.Request) {
		w.answer(rw, r, func(turn *sizeTurn) []byte {
			if w.pub != nil && !w.publish(turn) {
				return nil
			}
			return turn.answer
		})
	})
	srv := httptest.NewServer(mux)
	b.Cleanup(srv.Close)
	w.url = srv.URL
	return w
}

// answer reads the request, checks that it is the current turn's, and writes what reply gives
// for the turn (an error when nil).
func (w *sizeWorker) answer(rw http.ResponseWriter, r *http.Request, reply func(*sizeTurn) []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Reset()
	if _, err := w.buf.ReadFrom(r.Body); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	turn := w.current.Load()
	req := w.buf.Bytes()
	if !bytes.Contains(req[max(len(req)-8<<10, 0):], turn.tail) {
		http.Error(rw, fmt.Sprintf("%s: not the turn being sent (%d bytes)", r.URL.Path, len(req)), http.StatusBadRequest)
		return
	}
	out := reply(turn)
	if out == nil {
		http.Error(rw, fmt.Sprintf("the engine holds %d blocks of conversation %d, the turn follows %d of conversation %d",
			w.engineHeld, w.engineConv, turn.from, turn.conversation), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
}

// publish sends the blocks turn added to the engine's cache; false when the engine does not hold
// the previous turn's (the conversation moved here mid-way, which the benchmark does not expect).
func (w *sizeWorker) publish(turn *sizeTurn) bool {
	if turn.conversation != w.engineConv {
		w.engineConv, w.engineHeld = turn.conversation, 0
	}
	if w.engineHeld != turn.from {
		return false
	}
	if turn.stored != nil {
		w.pub.Send(turn.stored, false)
		w.published.Add(int64(turn.blocks - turn.from))
	}
	w.engineHeld = turn.blocks
	return true
}

// joinStream publishes a block of its own until the router's index has it, since a subscriber
// misses what is published before it joins, and records what the index holds of w then.
func (w *sizeWorker) joinStream(b *testing.B, r *Router) {
	for k := 0; ; k++ {
		if k == 500 {
			b.Fatalf("%s: the router never indexed its engine's blocks", w.url)
		}
		tokens := make([]int, 16)
		for i := range tokens {
			tokens[i] = 200_000 + k*16 + i
		}
		payload, err := msgpack.Marshal([]any{1.5, []any{[]any{"BlockStored", []any{int64(1)<<60 + int64(k)}, nil, tokens, 16, nil, "GPU", nil, nil}}, nil})
		if err != nil {
			b.Fatal(err)
		}
		w.pub.Send(payload, false)
		time.Sleep(20 * time.Millisecond)
		if n := indexedBlocks(r, w.url); n > 0 {
			w.base = n
			return
		}
	}
}

// awaitIndexed waits until the router's index holds every block w's engine published.
func (w *sizeWorker) awaitIndexed(b *testing.B, r *Router) {
	want := w.base + int(w.published.Load())
	deadline := time.Now().Add(10 * time.Second)
	for indexedBlocks(r, w.url) < want {
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d blocks indexed, want %d", w.url, indexedBlocks(r, w.url), want)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// indexedBlocks is how many blocks the router's index holds for worker.
func indexedBlocks(r *Router, worker string) int {
	for _, st := range r.kvEvents.Status() {
		if string(st.Worker) == worker {
			return st.Blocks
		}
	}
	return 0
}
