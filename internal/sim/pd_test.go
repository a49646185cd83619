package sim

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// pdReply is a chat answer with the fields the KV-transfer legs add.
type pdReply struct {
	chatReply
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

// pdChat posts a chat request with the given kv_transfer_params (nil: none) to a server.
func pdChat(t *testing.T, url string, msgs []msg, maxTokens int, params any) (int, pdReply, string) {
	t.Helper()
	req := map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": maxTokens, "ignore_eos": true}
	if params != nil {
		req["kv_transfer_params"] = params
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw strings.Builder
	var r pdReply
	dec := json.NewDecoder(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
	} else {
		var v any
		_ = dec.Decode(&v)
		b, _ := json.Marshal(v)
		raw.Write(b)
	}
	return resp.StatusCode, r, raw.String()
}

// prefillRequest is what a router sends a prefill worker.
var prefillRequest = map[string]any{
	"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
	"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
}

func serve(t *testing.T, w *Worker) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	return srv
}

func TestPrefillLeg_AnswersParamsNamingItselfAndHoldsTheBlocks(t *testing.T) {
	p := newWorker(t, testConfig())
	srv := serve(t, p)
	conv := []msg{{"user", words("doc", 2000)}}

	status, r, body := pdChat(t, srv.URL, conv, 1, prefillRequest)
	if status != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", status, body)
	}
	kp := r.KVTransferParams
	if kp == nil || !kp.DoRemotePrefill || kp.DoRemoteDecode || kp.RemoteEngineID == nil || *kp.RemoteEngineID != p.engineID || kp.RemoteRequestID == nil {
		t.Fatalf("kv_transfer_params %+v: want do_remote_prefill naming engine %s and a request", kp, p.engineID)
	}
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	if kp.RemoteHost == nil || *kp.RemoteHost != host || kp.RemotePort == nil || strconv.Itoa(*kp.RemotePort) != port {
		t.Fatalf("remote host/port %v:%v, want the worker's own %s:%s", kp.RemoteHost, kp.RemotePort, host, port)
	}
	blocks := r.Usage.PromptTokens / p.cfg.BlockSize
	if len(kp.RemoteBlockIDs) != blocks || blocks == 0 {
		t.Fatalf("%d remote block ids for a prompt of %d tokens, want %d", len(kp.RemoteBlockIDs), r.Usage.PromptTokens, blocks)
	}
	if r.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill leg generated %d tokens, want the 1 it asked for", r.Usage.CompletionTokens)
	}
	if got := p.Stats().PinnedBlocks; got != blocks {
		t.Fatalf("%d blocks pinned after the prefill leg, want its %d held for the decode worker", got, blocks)
	}
	// An ordinary answer carries no kv_transfer_params.
	if _, r, _ := pdChat(t, srv.URL, []msg{{"user", "hello"}}, 2, nil); r.KVTransferParams != nil {
		t.Fatalf("a colocated answer carried %+v", r.KVTransferParams)
	}
}

func TestPrefillLeg_HoldEndsAfterKVTransferHold(t *testing.T) {
	cfg := testConfig()
	cfg.KVTransferHold = 20 * time.Millisecond // wall time, since TimeScale is 0
	p := newWorker(t, cfg)
	srv := serve(t, p)
	if status, _, body := pdChat(t, srv.URL, []msg{{"user", words("doc", 800)}}, 1, prefillRequest); status != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", status, body)
	}
	testkit.WaitFor(t, "the unpulled hold to end", func() bool { return p.Stats().PinnedBlocks == 0 })
}

func TestDecodeLeg_PullsThePromptInsteadOfComputingIt(t *testing.T) {
	p, d := newWorker(t, testConfig()), newWorker(t, testConfig())
	ps, ds := serve(t, p), serve(t, d)
	decoded := collect(d)
	conv := []msg{{"user", words("doc", 2000)}}

	_, pr, _ := pdChat(t, ps.URL, conv, 1, prefillRequest)
	status, dr, body := pdChat(t, ds.URL, conv, 8, pr.KVTransferParams)
	if status != http.StatusOK {
		t.Fatalf("decode leg: %d %s", status, body)
	}
	prompt := dr.Usage.PromptTokens
	if dr.Usage.PromptTokensDetails.CachedTokens != prompt-1 || dr.Usage.CompletionTokens != 8 {
		t.Fatalf("decode leg usage %+v: want %d of %d prompt tokens cached (pulled) and 8 generated", dr.Usage, prompt-1, prompt)
	}
	res := decoded.list()[0]
	cfg := d.cfg
	want := cfg.PrefillOverhead + cfg.PrefillTimePerToken + time.Duration(prompt-1)*cfg.KVTransferTimePerToken
	if res.TransferredTokens != prompt-1 || res.CachedTokens != 0 || res.PrefillTime != want || res.TransferFailed {
		t.Fatalf("result %+v: want %d tokens pulled, none hit locally, prefill time %v", res, prompt-1, want)
	}
	if s := d.Stats(); s.TransferredTokens != int64(prompt-1) || s.CachedTokens != 0 {
		t.Fatalf("decode stats: %d transferred, %d cached; want %d and 0 (local hits only)", s.TransferredTokens, s.CachedTokens, prompt-1)
	}
	testkit.WaitFor(t, "the prefill worker's hold to be released by the pull", func() bool { return p.Stats().PinnedBlocks == 0 })

	// The decode worker now holds the conversation: the next turn hits its own cache.
	next := append(conv, msg{"assistant", "ok"}, msg{"user", "go on"})
	_, nr, _ := pdChat(t, ds.URL, next, 2, nil)
	if nr.Usage.PromptTokensDetails.CachedTokens < prompt/cfg.BlockSize*cfg.BlockSize-cfg.BlockSize {
		t.Fatalf("next turn on the decode worker hit %d of %d tokens, want the pulled prompt", nr.Usage.PromptTokensDetails.CachedTokens, nr.Usage.PromptTokens)
	}
}

func TestDecodeLeg_PullsOnlyWhatItsOwnCacheLacks(t *testing.T) {
	p, d := newWorker(t, testConfig()), newWorker(t, testConfig())
	ps, ds := serve(t, p), serve(t, d)
	doc := words("doc", 2000)
	pdChat(t, ds.URL, []msg{{"user", doc}}, 2, nil) // the decode worker computed the document before
	decoded := collect(d)

	conv := []msg{{"user", doc + " and one more question about it"}}
	_, pr, _ := pdChat(t, ps.URL, conv, 1, prefillRequest)
	_, dr, _ := pdChat(t, ds.URL, conv, 2, pr.KVTransferParams)
	res := decoded.list()[0]
	if res.CachedTokens == 0 || res.TransferredTokens != dr.Usage.PromptTokens-res.CachedTokens-1 {
		t.Fatalf("result %+v of a %d-token prompt: want a local hit and only the rest pulled", res, dr.Usage.PromptTokens)
	}
	if dr.Usage.PromptTokensDetails.CachedTokens != dr.Usage.PromptTokens-1 {
		t.Fatalf("usage cached %d of %d, want local hit + pulled", dr.Usage.PromptTokensDetails.CachedTokens, dr.Usage.PromptTokens)
	}
}

func TestDecodeLeg_IsRefusedWhenThePrefillWorkerIsGone(t *testing.T) {
	p, d := newWorker(t, testConfig()), newWorker(t, testConfig())
	ps, ds := serve(t, p), serve(t, d)
	conv := []msg{{"user", words("doc", 1000)}}
	_, pr, _ := pdChat(t, ps.URL, conv, 1, prefillRequest)
	p.Close()

	status, _, body := pdChat(t, ds.URL, conv, 4, pr.KVTransferParams)
	if status != http.StatusInternalServerError || !strings.Contains(body, "are gone") {
		t.Fatalf("decode leg after its prefill worker died: %d %s, want 500 under kv_load_failure_policy fail", status, body)
	}
	if s := d.Stats(); s.TransferFailures != 1 || s.Requests != 0 {
		t.Fatalf("stats %+v: want one transfer failure and no request run", s)
	}
}

func TestDecodeLeg_RecomputesWhenThePrefillWorkerIsGoneUnderRecompute(t *testing.T) {
	cfg := testConfig()
	cfg.KVLoadFailurePolicy = KVLoadRecompute
	p, d := newWorker(t, testConfig()), newWorker(t, cfg)
	ps, ds := serve(t, p), serve(t, d)
	decoded := collect(d)
	conv := []msg{{"user", words("doc", 1000)}}
	_, pr, _ := pdChat(t, ps.URL, conv, 1, prefillRequest)
	p.Close() // the prefill worker dies with the blocks

	status, dr, body := pdChat(t, ds.URL, conv, 4, pr.KVTransferParams)
	if status != http.StatusOK || dr.Usage.CompletionTokens != 4 {
		t.Fatalf("decode leg after its prefill worker died: %d %s %+v, want a whole answer", status, body, dr.Usage)
	}
	res := decoded.list()[0]
	if !res.TransferFailed || res.TransferredTokens != 0 || dr.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("result %+v, usage %+v: want a failed transfer and the prompt computed here", res, dr.Usage)
	}
	if s := d.Stats(); s.TransferFailures != 1 {
		t.Fatalf("%d transfer failures counted, want 1", s.TransferFailures)
	}
}

func TestKVTransferParams_BadOnesAre400(t *testing.T) {
	w := newWorker(t, testConfig())
	srv := serve(t, w)
	for name, params := range map[string]any{
		"both directions":       map[string]any{"do_remote_decode": true, "do_remote_prefill": true},
		"decode without engine": map[string]any{"do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": []int{}},
		"not an object":         "yes",
	} {
		status, _, body := pdChat(t, srv.URL, []msg{{"user", "hi"}}, 1, params)
		if status != http.StatusBadRequest || !strings.Contains(body, "kv_transfer_params") {
			t.Errorf("%s: %d %s, want 400 naming kv_transfer_params", name, status, body)
		}
	}
}

// A decode step that shares the engine with a prompt being computed takes longer by that
// prompt's tokens, up to the step budget: what disaggregation removes.
func TestPrefillInTheSameStepSlowsOtherRequestsDecode(t *testing.T) {
	cfg, clock := clockedConfig()
	cfg.MaxNumBatchedTokens = 256
	cfg.PrefillOverhead = 0
	w := newWorker(t, cfg)
	rs := collect(w)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); chat(t, w, []msg{{"user", words("long", 20000)}}, 1) }()
	testkit.WaitFor(t, "the long prompt to be computing", func() bool { return w.prefilling.Load() > 1000 })
	go func() { defer wg.Done(); chat(t, w, []msg{{"user", "hi"}}, 3) }()
	testkit.WaitFor(t, "both prefills to sleep", func() bool { return clock.Sleepers() == 2 })
	// The short prompt's prefill ends long before the long one's; its two decode steps then each
	// carry 256 of the long prompt's tokens. Time moves only while both sleep.
	shortDone := func() bool { return len(rs.list()) == 1 }
	for !shortDone() {
		if w.prefilling.Load() < 1000 {
			t.Fatal("the long prompt finished before the short request's decode")
		}
		clock.Advance(10 * time.Millisecond)
		testkit.WaitFor(t, "both requests to sleep again", func() bool { return clock.Sleepers() == 2 || shortDone() })
	}
	clock.Advance(time.Minute)
	wg.Wait()

	var short Result
	for _, r := range rs.list() {
		if r.PromptTokens < 100 {
			short = r
		}
	}
	step := cfg.InterTokenLatency + 256*cfg.PrefillTimePerToken
	if got := short.E2E - short.TTFT; got != 2*step {
		t.Fatalf("the short request's two decode steps took %v, want 2 × %v", got, step)
	}
}
