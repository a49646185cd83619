package proxy

import (
	"encoding/json"
	"errors"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/kvtransfer"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// pd.go runs prefill/decode disaggregation over vLLM's two-step KV transfer (its NIXL
// connector's protocol), for the routes that take kv_transfer_params (chat completions and
// completions):
//
//  1. The decode worker is chosen first, among the decode workers, by the policy: the session
//     map and the prefix tree hold the conversation's worker, since after a transfer the decode
//     worker holds the whole prompt.
//  2. If that worker is predicted to hold all but fewer than PDOptions.MinUncachedTokens of the
//     prompt (a continuation of its own session, a short prompt), it computes them itself: the
//     request goes to it as it came, and no transfer is made.
//  3. Otherwise a prefill worker, chosen among the prefill workers by the prefill policy (its
//     own prefix tree: what each prefill worker holds), gets a copy of the request with
//     kv_transfer_params {do_remote_decode: true, …}, stream off and one token to generate. Its
//     answer's kv_transfer_params go into the request sent to the decode worker, which pulls the
//     prompt's KV from the prefill worker and streams the answer as the client asked.
//
// Both legs go through the one attempt loop (forward.go), each with its policy among the workers
// of its role: the decode leg is the request itself, and the prefill leg runs within its first
// attempt, once its decode worker is chosen (prefillLeg). Each retries as the router always does
// what never reached a worker; the legs' bodies and the prefill's answer are package
// kvtransfer's. A prefill that fails on every prefill worker, or answers without
// kv_transfer_params, leaves the decode worker to compute the prompt: the request is slower, not
// failed. A decode worker that answered a retryable 5xx may have failed to pull the KV (vLLM's
// kv_load_failure_policy "fail"); the next decode attempt then goes without the parameters.
// Both steps are one request for metrics, traces and the access log; the path it took is in
// x-vllm-router-pd and vllm_router_pd_requests_total.

// PDOptions turn on prefill/decode disaggregation.
type PDOptions struct {
	// Prefill chooses the prefill worker among the prefill workers; the server's policy chooses
	// the decode worker.
	Prefill policy.Policy
	// MinUncachedTokens: a decode worker predicted to compute fewer of the prompt's tokens than
	// this computes them itself, without a transfer.
	MinUncachedTokens int
}

// The paths a P/D request takes, its x-vllm-router-pd value and vllm_router_pd_requests_total's
// path label.
const (
	PDTransfer       = "transfer"          // prefilled on a prefill worker, decoded on a decode worker
	PDLocalCached    = "local_cached"      // the decode worker held all but a few of the prompt's tokens
	PDLocalShort     = "local_short"       // the prompt was shorter than the threshold
	PDPrefillFailed  = "prefill_failed"    // no prefill worker gave KV to transfer: decoded and prefilled on the decode worker
	PDTransferFailed = "transfer_failed"   // the decode worker that got the transfer failed; another computed the prompt
	PDNoPrefill      = "no_prefill_worker" // no prefill worker serving the model was available
)

// PDPaths lists every path, for the metric's series to exist from the start.
var PDPaths = []string{PDTransfer, PDLocalCached, PDLocalShort, PDPrefillFailed, PDTransferFailed, PDNoPrefill}

// pdState is a P/D request's progress.
type pdState struct {
	path    string // one of the PD paths once decided; "" before
	body    []byte // the decode leg's body: the request with the prefill's kv_transfer_params; nil: as it came
	prefill string // the prefill worker's name, when a prefill leg succeeded
}

// pdCandidates splits a P/D route's candidates: the decode workers take the request, the prefill
// workers its prefill leg. Without a decode worker, the request goes to the colocated workers
// without P/D. A route that takes no kv_transfer_params goes to any worker but a prefill one.
func (s *Server) pdCandidates(ex *exchange) {
	all := ex.in.Candidates
	if ex.route.pd {
		if decode := workers.OfRole(all, workers.RoleDecode); len(decode) > 0 {
			ex.in.Candidates = decode
			ex.pd = &pdState{}
			return
		}
	}
	var others []*workers.Worker
	for _, w := range all {
		if w.Role() != workers.RolePrefill {
			others = append(others, w)
		}
	}
	if len(others) > 0 {
		ex.in.Candidates = others
	}
}

// decidePD runs once per P/D request, after its decode worker was chosen for the first time:
// it decides whether a transfer pays and, if so, runs the prefill leg and prepares the decode
// leg's body. It never fails the request.
func (s *Server) decidePD(ctx *fasthttp.RequestCtx, ex *exchange, dec policy.Decision) {
	st := ex.pd
	threshold := s.opts.PD.MinUncachedTokens
	switch {
	case ex.in.PrefillTokens(0) < threshold:
		st.path = PDLocalShort
		return
	case dec.Prefill < threshold:
		st.path = PDLocalCached
		return
	}
	body := ctx.PostBody()
	legBody, err := kvtransfer.PrefillBody(body)
	switch {
	case errors.Is(err, kvtransfer.ErrOwnTransfer):
		st.path = PDLocalCached // the client runs its own transfer; leave its parameters alone
		return
	case err != nil:
		st.path = PDPrefillFailed
		return
	}
	candidates, _, _ := s.candidates(ex.in.Request.Model)
	prefillers := workers.OfRole(candidates, workers.RolePrefill)
	if len(prefillers) == 0 {
		st.path = PDNoPrefill
		return
	}
	leg := &prefillLeg{s: s, ctx: ctx, ex: ex, in: ex.in, body: legBody}
	leg.in.Candidates = prefillers
	if end, _, _ := s.attempts(ex, leg); end != legAnswered {
		st.path = PDPrefillFailed
		return
	}
	st.path, st.prefill, st.body = PDTransfer, leg.worker, kvtransfer.DecodeBody(body, leg.params)
}

// prefillLeg is a P/D request's prefill leg in the attempt loop: placed among the prefill workers
// by the prefill policy, sent as the prefill leg's body, its answer read whole for the
// kv_transfer_params the decode leg carries. A failure of its own is never the request's: the
// decode worker then computes the prompt itself.
type prefillLeg struct {
	s    *Server
	ctx  *fasthttp.RequestCtx
	ex   *exchange
	in   policy.Input // the request, among the prefill workers
	body []byte       // the prefill leg's body (kvtransfer.PrefillBody)
	// What the leg got: the checked kv_transfer_params, and the name of the worker that holds
	// the prompt's KV.
	params json.RawMessage
	worker string
}

func (l *prefillLeg) input() *policy.Input { return &l.in }

func (l *prefillLeg) choose() policy.Decision { return l.s.opts.PD.Prefill.Select(l.in) }

// hold does not wait for KV room on a prefill worker: the decode worker computes the prompt.
func (l *prefillLeg) hold(*policy.Hold) bool { return false }

func (l *prefillLeg) accepted(dec policy.Decision, _ int) { l.s.opts.PD.Prefill.Accepted(l.in, dec) }

// send sends the prefill leg and reads its whole answer (at most kvtransfer.MaxAnswer bytes). An
// answer without kv_transfer_params fails the attempt, and another prefill worker may be asked;
// one whose parameters fail their check did compute the prompt, and is not tried elsewhere.
func (l *prefillLeg) send(dec policy.Decision, at *workers.Attempt, _ bool) (bool, upstream.Failure) {
	resp, conn, f := l.s.send(l.ctx, l.ex, dec.Worker, l.body)
	if resp == nil {
		return false, f
	}
	status := resp.StatusCode()
	body, err := io.ReadAll(io.LimitReader(resp.BodyStream(), kvtransfer.MaxAnswer+1))
	complete := err == nil && len(body) <= kvtransfer.MaxAnswer
	l.ex.call.Finish(conn, resp, complete)
	switch {
	case !complete:
		return false, upstream.Failure{Kind: upstream.KindMidStream, Message: "the prefill leg's answer broke off or was too large"}
	case status/100 != 2:
		return false, upstream.Failure{Kind: upstream.KindStatus, Retryable: upstream.RetryableStatus(status), Message: "the prefill worker answered " + strconv.Itoa(status)}
	}
	params, u, err := kvtransfer.Answer(body)
	switch {
	case err != nil:
		return false, upstream.Failure{Kind: upstream.KindBadReply, Message: err.Error()}
	case params == nil:
		return false, upstream.Failure{Retryable: true, Message: "the prefill worker answered without kv_transfer_params"}
	}
	at.Close(workers.Succeeded)
	var used policy.Usage
	if u.OK && u.CachedKnown {
		used = policy.Usage{Known: true, Prompt: u.Prompt, Cached: u.Cached}
	}
	l.s.opts.PD.Prefill.Done(l.in, dec, workers.Succeeded, used)
	l.params, l.worker = params, dec.Worker.Name()
	return true, f
}

func (l *prefillLeg) ended(dec policy.Decision, o workers.Outcome, f upstream.Failure, n int, _ bool) {
	l.s.opts.PD.Prefill.Done(l.in, dec, o, policy.Usage{})
	if o == workers.Failed {
		l.s.log.Warn("prefill leg failed", "request_id", l.ex.rid, "worker", dec.Worker.Name(), "attempt", n, "kind", f.Kind, "message", f.Message)
	}
}

// pullFailed reports whether status answers a decode leg that carried a prefill's
// kv_transfer_params with a 500: what vLLM answers when the pull of the KV failed under its
// default kv_load_failure_policy. Nothing of the answer reached the client, so another decode
// worker computes the prompt instead. Safe on a nil st.
func (st *pdState) pullFailed(status int) bool {
	return st != nil && st.body != nil && status == fasthttp.StatusInternalServerError
}

// pdFailed records that a decode attempt of a transfer failed with an answer (a retryable 5xx,
// perhaps the KV pull): the next decode attempt computes the prompt itself.
func (ex *exchange) pdFailed(f upstream.Failure) {
	if st := ex.pd; st != nil && st.body != nil && f.Kind == upstream.KindStatus {
		st.body, st.path = nil, PDTransferFailed
	}
}
