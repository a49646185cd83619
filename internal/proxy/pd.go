package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/tenant"
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
// Each step retries as the router always does, on another worker of its role, what never
// reached a worker. A prefill that fails on every prefill worker, or answers without
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

// prefillRequestParams are the kv_transfer_params of a prefill leg: decode elsewhere.
var prefillRequestParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

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
	leg, err := prefillBody(body)
	switch {
	case errors.Is(err, errOwnTransfer):
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
	params, name := s.runPrefill(ctx, ex, leg, prefillers)
	if params == nil {
		st.path = PDPrefillFailed
		return
	}
	st.path, st.prefill, st.body = PDTransfer, name, withField(body, "kv_transfer_params", params)
}

// runPrefill sends the prefill leg to the prefill workers, one after another while the failure
// provably started nothing, and returns the kv_transfer_params of the first that answered with
// them, and that worker's name.
func (s *Server) runPrefill(ctx *fasthttp.RequestCtx, ex *exchange, leg []byte, prefillers []*workers.Worker) (json.RawMessage, string) {
	p := s.opts.PD.Prefill
	in := ex.in
	in.Candidates = prefillers
	for attempt := 0; len(in.Candidates) > 0 && attempt <= s.opts.MaxRetries; {
		dec := p.Select(in)
		if dec.Worker == nil {
			return nil, ""
		}
		in.Candidates = without(in.Candidates, dec.Worker.URL())
		at := s.pool.Acquire(dec.Worker)
		if at == nil {
			continue
		}
		attempt++
		at.Prefill(dec.Prefill)
		p.Accepted(in, dec)
		params, u, f := s.prefillOn(ctx, ex, dec.Worker, leg)
		if f.Kind == "" && params != nil {
			at.Close(workers.Succeeded)
			p.Done(in, dec, workers.Succeeded, u)
			return params, dec.Worker.Name()
		}
		at.Close(workers.Failed)
		p.Done(in, dec, workers.Failed, policy.Usage{})
		if f.Kind != "" {
			s.metrics.UpstreamErrors.WithLabelValues(f.Kind).Inc()
		}
		s.log.Warn("prefill leg failed", "request_id", ex.rid, "worker", dec.Worker.Name(), "attempt", attempt, "kind", f.Kind, "message", f.Message)
		if ex.gone.Load() || (f.Kind != "" && !f.Retryable) || time.Now().After(ex.deadline) {
			return nil, ""
		}
	}
	return nil, ""
}

// maxPrefillAnswer bounds the prefill leg's answer the router reads: one token and its
// parameters.
const maxPrefillAnswer = 1 << 20

// prefillOn sends the prefill leg to w and reads its whole answer: the kv_transfer_params it
// carries (nil when it carries none) and its usage. The leg must answer within the first-byte
// timeout.
func (s *Server) prefillOn(ctx *fasthttp.RequestCtx, ex *exchange, w *workers.Worker, leg []byte) (json.RawMessage, policy.Usage, upstream.Failure) {
	pool, err := s.upstreams.Pool(w.URL())
	if err != nil {
		return nil, policy.Usage{}, upstream.Failure{Kind: upstream.KindConnect, Retryable: true, Message: "the worker's URL is not usable"}
	}
	out := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(out)
	s.buildRequest(ctx, out, w, ex.rid, pool.Target.Authorization)
	out.SetBodyRaw(leg)
	ex.trace.Inject(&out.Header)
	headersBy := ex.headersBy
	if fb := s.opts.Upstream.Timeouts.FirstByte; fb > 0 {
		if t := time.Now().Add(fb); t.Before(headersBy) {
			headersBy = t
		}
	}
	ex.call.Peer, ex.call.Deadline, ex.call.HeadersBy, ex.call.CheckStall = w, ex.deadline, headersBy, true
	resp, c, f := pool.Send(out, &ex.call)
	if resp == nil {
		return nil, policy.Usage{}, f
	}
	status := resp.StatusCode()
	body, err := io.ReadAll(io.LimitReader(resp.BodyStream(), maxPrefillAnswer+1))
	complete := err == nil && len(body) <= maxPrefillAnswer
	ex.call.Finish(c, resp, complete)
	switch {
	case !complete:
		return nil, policy.Usage{}, upstream.Failure{Kind: upstream.KindMidStream, Message: "the prefill leg's answer broke off or was too large"}
	case status/100 != 2:
		return nil, policy.Usage{}, upstream.Failure{Kind: upstream.KindStatus, Retryable: upstream.RetryableStatus(status), Message: "the prefill worker answered " + strconv.Itoa(status)}
	}
	var answer struct {
		KVTransferParams json.RawMessage    `json:"kv_transfer_params"`
		Usage            *sniff.UsageObject `json:"usage"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, policy.Usage{}, upstream.Failure{Kind: upstream.KindBadReply, Message: "the prefill leg's answer is not JSON"}
	}
	var u policy.Usage
	if answer.Usage != nil {
		if t := answer.Usage.Tokens(); t.OK && t.CachedKnown {
			u = policy.Usage{Known: true, Prompt: t.Prompt, Cached: t.Cached}
		}
	}
	if len(answer.KVTransferParams) == 0 || string(answer.KVTransferParams) == "null" {
		return nil, u, upstream.Failure{}
	}
	params, err := checkTransferParams(answer.KVTransferParams)
	if err != nil {
		return nil, u, upstream.Failure{Kind: upstream.KindBadReply, Message: "the prefill worker's kv_transfer_params " + err.Error()}
	}
	return params, u, upstream.Failure{}
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

// errOwnTransfer is prefillBody's answer for a request that carries kv_transfer_params itself.
var errOwnTransfer = errors.New("the request carries its own kv_transfer_params")

// prefillBody is the prefill leg of a request body: the same request with kv_transfer_params
// asking for a remote decode, not streamed, generating one token.
func prefillBody(body []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	if fields == nil {
		return nil, errors.New("the request is not a JSON object")
	}
	if _, own := fields["kv_transfer_params"]; own {
		return nil, errOwnTransfer
	}
	one := json.RawMessage("1")
	fields["kv_transfer_params"] = prefillRequestParams
	fields["stream"] = json.RawMessage("false")
	delete(fields, "stream_options")
	fields["max_tokens"] = one
	for _, limit := range []string{"max_completion_tokens", "min_tokens"} {
		if _, ok := fields[limit]; ok {
			fields[limit] = one
		}
	}
	return json.Marshal(fields)
}

// withField returns a JSON object's bytes with one more member, key: value, at its end. obj is a
// JSON object the route's reader accepted, which holds no member key.
func withField(obj []byte, key string, value []byte) []byte {
	end := bytes.LastIndexByte(obj, '}')
	inner := bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1 : end])
	out := make([]byte, 0, len(obj)+len(key)+len(value)+4)
	out = append(out, obj[:end]...)
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = strconv.AppendQuote(out, key)
	out = append(out, ':')
	out = append(out, value...)
	return append(out, obj[end:]...)
}

// checkTransferParams checks the kv_transfer_params a prefill worker answered with before they go
// to a decode worker, and returns them re-encoded: one member per name, compact, so that the
// decode worker reads exactly what was checked. The prefill worker is a peer like any other: its
// answer is bounded (maxPrefillAnswer) and must have the shape of vLLM's NIXL connector's
// answer, which names the prefill engine and the blocks it holds:
//
//   - do_remote_prefill: true (do_remote_decode, when present, false);
//   - remote_engine_id: a non-empty string; remote_request_id, when present, a string;
//   - remote_block_ids: a list of block ids, or one such list per KV-cache group (what newer
//     vLLM sends for hybrid models), each id a non-negative integer;
//   - remote_host: an IP address or a host name; remote_port: an integer from 1 to 65535;
//   - tp_size, when present, a positive integer.
//
// Other members (what other connectors and later versions add) pass as they came.
func checkTransferParams(raw json.RawMessage) (json.RawMessage, error) {
	var params map[string]json.RawMessage
	if err := json.Unmarshal(raw, &params); err != nil || params == nil {
		return nil, errors.New("are not a JSON object")
	}
	var (
		prefill, decode   bool
		engine, request   string
		blocks            json.RawMessage
		host              string
		port, tensorRanks json.Number
	)
	for _, f := range []struct {
		name     string
		into     any
		required bool
	}{
		{"do_remote_prefill", &prefill, true},
		{"do_remote_decode", &decode, false},
		{"remote_engine_id", &engine, true},
		{"remote_request_id", &request, false},
		{"remote_block_ids", &blocks, true},
		{"remote_host", &host, true},
		{"remote_port", &port, true},
		{"tp_size", &tensorRanks, false},
	} {
		v, ok := params[f.name]
		switch {
		case !ok && f.required:
			return nil, fmt.Errorf("lack %s", f.name)
		case !ok:
			continue
		}
		if err := strictUnmarshal(v, f.into); err != nil {
			return nil, fmt.Errorf("have a %s of the wrong type: %s", f.name, truncate(string(v), 64))
		}
	}
	switch {
	case !prefill:
		return nil, errors.New("do not ask for a remote prefill (do_remote_prefill is not true)")
	case decode:
		return nil, errors.New("ask for a remote decode (do_remote_decode is true)")
	case engine == "":
		return nil, errors.New("name no engine (remote_engine_id is empty)")
	case !blockIDs(blocks):
		return nil, fmt.Errorf("have remote_block_ids that are not lists of block ids: %s", truncate(string(blocks), 64))
	case !validHost(host):
		return nil, fmt.Errorf("have a remote_host that is no host: %q", truncate(host, 64))
	case !inRange(port, 1, 65535):
		return nil, fmt.Errorf("have a remote_port out of range: %s", truncate(port.String(), 64))
	case tensorRanks != "" && !inRange(tensorRanks, 1, 1<<20):
		return nil, fmt.Errorf("have a tp_size that is no positive integer: %s", truncate(tensorRanks.String(), 64))
	}
	out, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// strictUnmarshal decodes v into a bool, a string, a json.Number or a json.RawMessage, refusing a
// value of another JSON type (null among them) where encoding/json would leave the zero value.
func strictUnmarshal(v json.RawMessage, into any) error {
	if string(v) == "null" {
		return errors.New("null")
	}
	if n, ok := into.(*json.Number); ok {
		if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
			return errors.New("not a number")
		}
		*n = json.Number(v)
		return nil
	}
	return json.Unmarshal(v, into)
}

// inRange reports whether n is an integer, written without fraction or exponent, in [lo, hi].
func inRange(n json.Number, lo, hi int64) bool {
	i, err := strconv.ParseInt(string(n), 10, 64)
	return err == nil && i >= lo && i <= hi
}

// blockIDs reports whether raw is a list of block ids, or a list of such lists (one per KV-cache
// group), every id a non-negative integer; lists may be empty.
func blockIDs(raw json.RawMessage) bool {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || items == nil {
		return false
	}
	nested := len(items) > 0 && items[0][0] == '['
	for _, item := range items {
		if !nested {
			if !blockID(item) {
				return false
			}
			continue
		}
		var ids []json.RawMessage
		if item[0] != '[' || json.Unmarshal(item, &ids) != nil {
			return false
		}
		for _, id := range ids {
			if !blockID(id) {
				return false
			}
		}
	}
	return true
}

// blockID reports whether v is a non-negative integer of at most 18 digits, written without sign,
// fraction or exponent.
func blockID(v json.RawMessage) bool {
	if len(v) == 0 || len(v) > 18 {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validHost reports whether h is an IP address (without zone) or a DNS host name
// (tenant.IsHostName). A transfer peer named otherwise (a URL, a host:port, spaces, an empty
// string) is no peer a decode worker can reach.
func validHost(h string) bool {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	return tenant.IsHostName(h)
}
