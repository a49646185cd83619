package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// prefillWorker answers a prefill leg as vLLM's NIXL connector does, naming itself as the KV's
// engine.
func prefillWorker(t *testing.T, name string) *testkit.Server {
	return testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":%q,"remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":5600}}`, name)
	})
}

// pdProxy is a router with P/D over the given prefill and decode workers, transferring every
// prompt, each side placed round robin (in registration order); opts are testOptions() when nil.
func pdProxy(t *testing.T, opts *Options, prefill, decode []string) *testProxy {
	if opts == nil {
		o := testOptions()
		opts = &o
	}
	opts.PD = &PDOptions{Prefill: &policy.RoundRobin{}}
	tp := newTestProxy(t, setup{opts: opts, urls: append(append([]string{}, prefill...), decode...)})
	for _, u := range prefill {
		tp.worker(t, u).SetRole(workers.RolePrefill)
	}
	for _, u := range decode {
		tp.worker(t, u).SetRole(workers.RoleDecode)
	}
	return tp
}

// A prefill worker found stalled is no candidate: it never sees a leg, and the next prefill
// worker's KV is transferred.
func TestPD_APrefillWorkerFoundStalledTakesNoLeg(t *testing.T) {
	stalled, ok := prefillWorker(t, "p-stalled"), prefillWorker(t, "p-ok")
	var params atomic.Value
	decode := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			KVTransferParams json.RawMessage `json:"kv_transfer_params"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		params.Store(string(body.KVTransferParams))
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	tp := pdProxy(t, nil, []string{stalled.URL, ok.URL}, []string{decode.URL})
	tp.worker(t, stalled.URL).SetStalled(true)

	status, h, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || h.Get(HeaderPD) != PDTransfer || h.Get(HeaderPrefillWorker) != tp.worker(t, ok.URL).Name() {
		t.Fatalf("%d %s (pd %q, prefill worker %q), want 200 transferred from %s", status, body, h.Get(HeaderPD), h.Get(HeaderPrefillWorker), ok.URL)
	}
	if n := stalled.Hits.Load(); n != 0 {
		t.Errorf("the stalled prefill worker saw %d requests, want none", n)
	}
	if p, _ := params.Load().(string); !json.Valid([]byte(p)) || ok.Hits.Load() != 1 {
		t.Errorf("the decode worker got kv_transfer_params %q after %d prefill legs, want the second worker's", p, ok.Hits.Load())
	}
}

// Prefill legs that fail on every prefill worker, one after another, leave the decode worker to
// compute the prompt: the request is answered, and the prefill legs' re-sends are not the
// request's (vllm_router_retries_total counts none).
func TestPD_FailedPrefillLegsAreNotTheRequestsFailure(t *testing.T) {
	down1, down2 := testkit.NamedServer(t, http.StatusServiceUnavailable, "p1"), testkit.NamedServer(t, http.StatusServiceUnavailable, "p2")
	decode := okWorker(t, "d")
	tp := pdProxy(t, nil, []string{down1.URL, down2.URL}, []string{decode.URL})

	status, h, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || h.Get(HeaderPD) != PDPrefillFailed || h.Get(HeaderPrefillWorker) != "" {
		t.Fatalf("%d %s (pd %q), want 200 decoded without a transfer", status, body, h.Get(HeaderPD))
	}
	if down1.Hits.Load() != 1 || down2.Hits.Load() != 1 || decode.Hits.Load() != 1 {
		t.Errorf("prefill workers saw %d and %d legs, the decode worker %d requests; want 1, 1 and 1", down1.Hits.Load(), down2.Hits.Load(), decode.Hits.Load())
	}
	if n := testutil.ToFloat64(tp.Metrics.Retries); n != 0 {
		t.Errorf("retries_total = %v, want 0: the request was sent once", n)
	}
}

// The prefill leg goes through the attempt loop as every request does, and meets its rules: a
// prefill worker that sends no byte of any answer before the request's first-byte deadline is
// taken for stalled, as any worker the loop waited on, and the following requests' legs go
// elsewhere.
func TestPD_APrefillWorkerSilentPastTheFirstByteDeadlineIsStalled(t *testing.T) {
	hung := hangingWorker(t)
	decode := okWorker(t, "d")
	opts := testOptions()
	opts.Upstream.Timeouts.FirstByte = 300 * time.Millisecond
	tp := pdProxy(t, &opts, []string{hung.URL}, []string{decode.URL})

	_, _, _ = tp.post(t, chatPath, chatBody) // the leg waits out the deadline on the silent worker
	if hung.Requests.Load() != 1 {
		t.Fatalf("the silent prefill worker read %d legs, want 1", hung.Requests.Load())
	}
	if !tp.worker(t, hung.URL).Stalled() {
		t.Error("the prefill worker that missed the first-byte deadline is not taken for stalled")
	}
}
