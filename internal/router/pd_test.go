package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// pdRig is a router in P/D mode over simulated prefill and decode workers, and one colocated
// simulator outside the router to compare answers with.
type pdRig struct {
	tr              *testRouter
	prefill, decode []*sim.Worker
	prefillURLs     []string
	decodeURLs      []string
	reference       string // a colocated simulator, reached directly
	client          *http.Client
}

func startPDRig(t *testing.T, prefills, decodes int, simCfg sim.Config) *pdRig {
	t.Helper()
	pf := startSimFleetOf(t, prefills, simCfg)
	df := startSimFleetOf(t, decodes, simCfg)
	ref := startSimFleetOf(t, 1, simCfg)

	tr := startPDRouter(t)
	joinAs(t, tr, workers.RolePrefill, pf.URLs()...)
	joinAs(t, tr, workers.RoleDecode, df.URLs()...)
	transport := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	t.Cleanup(transport.CloseIdleConnections)
	return &pdRig{tr: tr, prefill: pf.Workers(), decode: df.Workers(), prefillURLs: pf.URLs(), decodeURLs: df.URLs(),
		reference: ref.URLs()[0], client: &http.Client{Transport: transport}}
}

// startPDRouter starts a cache_aware router in P/D mode, without workers.
func startPDRouter(t *testing.T) *testRouter {
	t.Helper()
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.PDDisaggregation = true
	cfg.PDMinUncachedTokens = 64
	return startRouter(t, cfg)
}

// joinAs joins the workers at urls in role, as the admin API does, and waits for their first probe.
func joinAs(t *testing.T, tr *testRouter, role workers.Role, urls ...string) {
	t.Helper()
	for _, raw := range urls {
		u, err := tenant.ParseURL(raw)
		if err != nil {
			t.Fatal(err)
		}
		j, err := tr.Join(t.Context(), fleet.Admin, u, role, kvevents.WorkerEndpoints{})
		if err != nil {
			t.Fatal(err)
		}
		<-j.Probed
	}
}

func (r *pdRig) openAI(base string) *openai.Client {
	c := openAIClient(base, r.client)
	return &c
}

func (r *pdRig) pdCount(path string) float64 {
	return testutil.ToFloat64(r.tr.Metrics().PDRequests.WithLabelValues(path))
}

func pdParams(doc string, session string) (openai.ChatCompletionNewParams, []option.RequestOption) {
	p := openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You review code."), openai.UserMessage(doc)},
		MaxTokens: openai.Int(24),
	}
	var opts []option.RequestOption
	if session != "" {
		opts = append(opts, option.WithHeader("x-session-id", session))
	}
	return p, opts
}

var (
	pdDocument    = strings.Repeat("func handle(w http.ResponseWriter, r *http.Request) { serve(w, r) } // review this ", 40)
	otherDocument = strings.Repeat("SELECT id, name FROM users WHERE active = true ORDER BY name; -- explain this query ", 40)
)

// A long chat through the P/D router is prefilled on a prefill worker and decoded on a decode
// worker that pulled the KV, and the client reads every byte it would read from one colocated
// worker, streamed and not.
func TestPD_AChatIsPrefilledOnOneWorkerDecodedOnAnotherAndReadsAsFromOne(t *testing.T) {
	cfg := instantSim()
	r := startPDRig(t, 2, 2, cfg)
	ctx := t.Context()
	params, _ := pdParams(pdDocument, "")

	var raw *http.Response
	got, err := r.openAI(r.tr.url).Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	want, err := r.openAI(r.reference).Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got.Choices[0].Message.Content != want.Choices[0].Message.Content || got.Choices[0].FinishReason != want.Choices[0].FinishReason ||
		got.Usage.PromptTokens != want.Usage.PromptTokens || got.Usage.CompletionTokens != want.Usage.CompletionTokens {
		t.Fatalf("P/D answer %q (%s, %+v) differs from the colocated one %q (%s, %+v)", got.Choices[0].Message.Content,
			got.Choices[0].FinishReason, got.Usage, want.Choices[0].Message.Content, want.Choices[0].FinishReason, want.Usage)
	}
	if raw.Header.Get(proxy.HeaderPD) != proxy.PDTransfer || !contains(r.prefillURLs, raw.Header.Get(proxy.HeaderPrefillWorker)) ||
		!contains(r.decodeURLs, raw.Header.Get(proxy.HeaderWorker)) {
		t.Fatalf("headers: pd %q, prefill %q, worker %q; want a transfer from a prefill worker to a decode worker",
			raw.Header.Get(proxy.HeaderPD), raw.Header.Get(proxy.HeaderPrefillWorker), raw.Header.Get(proxy.HeaderWorker))
	}
	// The usage counts the pulled prompt as cached, as vLLM's does: all but the last token.
	if got.Usage.PromptTokensDetails.CachedTokens != got.Usage.PromptTokens-1 {
		t.Fatalf("usage %+v: want all but one prompt token pulled", got.Usage)
	}

	// The same prompt again is held by its decode worker now: a new one streams through a transfer.
	params, _ = pdParams(otherDocument, "")
	want, err = r.openAI(r.reference).Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	stream := r.openAI(r.tr.url).Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&raw))
	var text strings.Builder
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			text.WriteString(c.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != want.Choices[0].Message.Content || raw.Header.Get(proxy.HeaderPD) != proxy.PDTransfer {
		t.Fatalf("streamed P/D answer %q (pd %q), colocated %q", text.String(), raw.Header.Get(proxy.HeaderPD), want.Choices[0].Message.Content)
	}
	var pulled, prefillLegs int64
	for _, w := range r.decode {
		pulled += w.Stats().TransferredTokens
	}
	for _, w := range r.prefill {
		prefillLegs += w.Stats().Completed
	}
	if prefillLegs != 2 || pulled < 2*(got.Usage.PromptTokens-1) {
		t.Fatalf("%d prefill legs, %d tokens pulled; want 2 legs, both prompts pulled", prefillLegs, pulled)
	}
	// A request is counted when the router ends it, which may come a moment after the client
	// read the stream's last bytes.
	testkit.WaitFor(t, "both transfers counted", func() bool { return r.pdCount(proxy.PDTransfer) == 2 })
}

// A session's later turns stay on their decode worker, which holds the conversation after the
// first transfer: they skip the transfer and are computed there.
func TestPD_ASessionsLaterTurnsSkipTheTransferOnTheirDecodeWorker(t *testing.T) {
	cfg := instantSim()
	r := startPDRig(t, 1, 2, cfg)
	ctx := t.Context()
	params, opts := pdParams(pdDocument, "agent-7")
	home := ""
	for turn := range 4 {
		var raw *http.Response
		reply, err := r.openAI(r.tr.url).Chat.Completions.New(ctx, params, append(opts, option.WithResponseInto(&raw))...)
		if err != nil {
			t.Fatal(err)
		}
		worker, path := raw.Header.Get(proxy.HeaderWorker), raw.Header.Get(proxy.HeaderPD)
		switch {
		case turn == 0 && path != proxy.PDTransfer:
			t.Fatalf("first turn took %q, want a transfer", path)
		case turn == 0:
			home = worker
		case worker != home || path != proxy.PDLocalCached:
			t.Fatalf("turn %d: %s on %s, want %s on the session's decode worker %s", turn+1, path, worker, proxy.PDLocalCached, home)
		}
		params.Messages = append(params.Messages, openai.AssistantMessage(reply.Choices[0].Message.Content), openai.UserMessage("Next file, please."))
	}
	if got := r.prefill[0].Stats().Completed; got != 1 {
		t.Fatalf("the prefill worker ran %d legs, want only the first turn's", got)
	}
}

// Short prompts are computed on the decode worker; requests of routes that take no
// kv_transfer_params never reach a prefill worker.
func TestPD_ShortPromptsAndOtherRoutesStayOffThePrefillWorkers(t *testing.T) {
	cfg := instantSim()
	r := startPDRig(t, 1, 1, cfg)
	resp := r.tr.post(t, "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(proxy.HeaderPD) != proxy.PDLocalShort {
		t.Fatalf("short chat: %d, pd %q; want 200 computed locally", resp.StatusCode, resp.Header.Get(proxy.HeaderPD))
	}
	for range 3 {
		resp := r.tr.post(t, "/v1/messages", `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":"`+pdDocument[:400]+`"}]}`)
		readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(proxy.HeaderWorker) != r.decodeURLs[0] || resp.Header.Get(proxy.HeaderPD) != "" {
			t.Fatalf("messages: %d on %s (pd %q), want the decode worker without P/D", resp.StatusCode, resp.Header.Get(proxy.HeaderWorker), resp.Header.Get(proxy.HeaderPD))
		}
	}
	if got := r.prefill[0].Stats().Requests; got != 0 {
		t.Fatalf("the prefill worker got %d requests, want none", got)
	}
}

// A prefill worker that is gone leaves the prompt to the decode worker; a decode worker that
// cannot pull the KV (its prefill worker died after the prefill) is replaced by one that computes
// the prompt. No request is lost.
func TestPD_NoRequestIsLostWhenAPrefillWorkerDies(t *testing.T) {
	cfg := instantSim()
	r := startPDRig(t, 1, 2, cfg)
	ctx := t.Context()

	// The prefill worker dies right after its leg: the decode worker's pull fails (vLLM's
	// default kv_load_failure_policy answers 500), and the next decode worker computes it.
	r.prefill[0].OnResult(func(sim.Result) { r.prefill[0].Close() })
	params, _ := pdParams(pdDocument, "")
	var raw *http.Response
	reply, err := r.openAI(r.tr.url).Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("the request whose prefill worker died after its leg: %v", err)
	}
	if raw.Header.Get(proxy.HeaderPD) != proxy.PDTransferFailed || reply.Usage.CompletionTokens != 24 {
		t.Fatalf("pd %q, usage %+v; want %s and the whole answer", raw.Header.Get(proxy.HeaderPD), reply.Usage, proxy.PDTransferFailed)
	}

	// Now the prefill worker does not answer at all.
	r.tr.Pool().Get(r.prefillURLs[0])[0].SetHealthy(false)
	params.Messages[1] = openai.UserMessage(otherDocument)
	if _, err := r.openAI(r.tr.url).Chat.Completions.New(ctx, params, option.WithResponseInto(&raw)); err != nil {
		t.Fatalf("the request without a prefill worker: %v", err)
	}
	if path := raw.Header.Get(proxy.HeaderPD); path != proxy.PDNoPrefill {
		t.Fatalf("pd %q without a healthy prefill worker, want %s", path, proxy.PDNoPrefill)
	}
	for _, path := range proxy.PDPaths { // every path's series exists; each request counted once
		if _, err := r.tr.Metrics().PDRequests.GetMetricWithLabelValues(path); err != nil {
			t.Fatal(err)
		}
	}
	if r.pdCount(proxy.PDTransferFailed) != 1 || r.pdCount(proxy.PDNoPrefill) != 1 || r.pdCount(proxy.PDTransfer) != 0 {
		t.Fatalf("counts: transfer_failed %v, no_prefill_worker %v, transfer %v", r.pdCount(proxy.PDTransferFailed), r.pdCount(proxy.PDNoPrefill), r.pdCount(proxy.PDTransfer))
	}
}

// A prefill worker's answer is a peer's answer: kv_transfer_params that are not an object, or name
// a host that is no host or a port out of range, never reach a decode worker. The prefill counts as
// failed (bad_response), and the decode worker computes the prompt; the client reads a whole answer.
func TestPD_AnswerWithBadTransferParamsIsDecodedWithoutThem(t *testing.T) {
	cfg := instantSim()
	decode := startSimFleetOf(t, 1, cfg)
	prefill := newFakeWorker(t, "sim-model")
	tr := startPDRouter(t)
	joinAs(t, tr, workers.RolePrefill, prefill.URL())
	joinAs(t, tr, workers.RoleDecode, decode.URLs()...)
	for i, params := range []string{
		`"do_remote_prefill"`,
		`{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[0],"remote_host":"127.0.0.1:5600/x","remote_port":70000}`,
		`{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[0],"remote_host":"127.0.0.1","remote_port":"5600"}`,
	} {
		prefill.setHandler(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"o"},"finish_reason":"length"}],"kv_transfer_params":`+params+`}`)
		})
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 8,
			"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%d %s", i, pdDocument)}}})
		resp := tr.post(t, "/v1/chat/completions", string(body))
		answer := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(proxy.HeaderPD) != proxy.PDPrefillFailed {
			t.Fatalf("prefill answered kv_transfer_params %s: %d (pd %q) %s; want 200 decoded without them (%s)",
				params, resp.StatusCode, resp.Header.Get(proxy.HeaderPD), answer, proxy.PDPrefillFailed)
		}
		if got := prefill.hits.Load(); got != int64(i+1) {
			t.Fatalf("%d prefill legs after %d requests", got, i+1)
		}
	}
	if pulled := decode.Workers()[0].Stats().TransferredTokens; pulled != 0 {
		t.Fatalf("the decode worker pulled %d tokens from peers named by bad parameters", pulled)
	}
	if v, _ := metricValue(t, tr, `vllm_router_upstream_errors_total{kind="bad_response"}`); v != 3 {
		t.Fatalf("bad_response errors %v, want 3", v)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// stubPrefillWorker answers a prefill leg at once with the parameters a decode leg needs.
var stubPrefillWorker = stubWorker(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"o"},"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":20,"completion_tokens":1,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0}},` +
	`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[0],"remote_request_id":"r","remote_host":"127.0.0.1","remote_port":1,"tp_size":1}}`)

// BenchmarkProxyPD measures one small chat request through a P/D router that always transfers:
// client → router → prefill worker, then router → decode worker, over real HTTP on loopback.
// Beside BenchmarkProxyChat it gives the cost of the second leg and of the body rewrites.
func BenchmarkProxyPD(b *testing.B) {
	prefill := httptest.NewServer(stubPrefillWorker)
	defer prefill.Close()
	decode := httptest.NewServer(stubChatWorker)
	defer decode.Close()
	cfg := testConfig()
	cfg.Prefill, cfg.Decode = []string{prefill.URL}, []string{decode.URL}
	cfg.PDDisaggregation = true
	cfg.PDMinUncachedTokens = 0
	benchProxyChat(b, cfg, func(h http.Header) error {
		if got := h.Get(proxy.HeaderPD); got != proxy.PDTransfer {
			return fmt.Errorf("%s %q, want %s", proxy.HeaderPD, got, proxy.PDTransfer)
		}
		return nil
	})()
}
