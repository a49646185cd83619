package sim

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
)

// pd.go plays both sides of vLLM's two-step KV transfer for prefill/decode disaggregation, as its
// NIXL connector does it, over the request's kv_transfer_params:
//
//   - A request with do_remote_decode is a prefill leg: the worker prefills the prompt (its
//     prefix cache counting as usual), generates the one token the leg asks for, keeps the
//     prompt's blocks pinned for KVTransferHold so that a decode worker can pull them, and answers
//     with kv_transfer_params naming itself (do_remote_prefill, remote_engine_id,
//     remote_block_ids, remote_request_id, remote_host, remote_port, tp_size).
//   - A request with do_remote_prefill is a decode leg: the worker looks its own prefix cache up,
//     pulls the rest of the prompt but its last token from the named engine in
//     KVTransferTimePerToken each instead of prefilling it, computes the last token itself, and
//     holds the whole prompt in its cache afterwards. Usage counts the pulled tokens as cached, as
//     vLLM's does; vllm:prefix_cache_hits_total counts only local hits, and
//     vllm:external_prefix_cache_hits_total the pulled ones.
//
// The pull releases the prefill worker's hold when that worker lives in the same process (the
// bench, the demo, tests); a prefill worker in another process keeps its hold until
// KVTransferHold ends. When the named engine lives here but no longer holds the request (the hold
// ended, or the worker closed), the transfer fails: under KVLoadFail (vLLM's default
// kv_load_failure_policy) the decode leg is answered 500 before anything else, under
// KVLoadRecompute the decode worker computes the prompt itself.

// KV load failure policies, Config.KVLoadFailurePolicy.
const (
	KVLoadFail      = "fail"
	KVLoadRecompute = "recompute"
)

// kvTransferParams is the kv_transfer_params object of a request or a prefill answer. Pointers
// tell an absent field from a zero one.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteRequestID *string `json:"remote_request_id,omitempty"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// transferRole is what a request's kv_transfer_params make of it.
type transferRole uint8

const (
	colocated  transferRole = iota // no kv_transfer_params: prefill and decode here
	prefillLeg                     // do_remote_decode: prefill here, decode elsewhere
	decodeLeg                      // do_remote_prefill: prefill elsewhere, decode here
)

// transfer is a job's part in a KV transfer.
type transfer struct {
	role transferRole
	// engineID and requestID name the prefill engine and its request, on a decode leg.
	engineID, requestID string
	// holdID names a prefill leg's hold, and heldBlocks counts its blocks once it finished.
	holdID     string
	heldBlocks int
}

// parseTransfer reads a request's kv_transfer_params. Absent or null means colocated.
func parseTransfer(raw json.RawMessage) (transfer, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return transfer{}, nil
	}
	var p kvTransferParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return transfer{}, badf("kv_transfer_params: %v", err)
	}
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return transfer{}, badf("kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive")
	case p.DoRemoteDecode:
		return transfer{role: prefillLeg, holdID: newID("kvx-")}, nil
	case p.DoRemotePrefill:
		if p.RemoteEngineID == nil || *p.RemoteEngineID == "" || p.RemoteHost == nil || p.RemotePort == nil || p.RemoteBlockIDs == nil {
			return transfer{}, badf("kv_transfer_params: do_remote_prefill needs remote_engine_id, remote_block_ids, remote_host and remote_port")
		}
		t := transfer{role: decodeLeg, engineID: *p.RemoteEngineID}
		if p.RemoteRequestID != nil {
			t.requestID = *p.RemoteRequestID
		}
		return t, nil
	}
	return transfer{}, nil // both false: an ordinary request
}

// engines maps an engine id to the worker of this process that has it, so that a decode leg can
// pull from (release the hold of) a prefill worker that lives here, or to goneEngine once that
// worker closed.
var engines sync.Map // string → *Worker | goneEngine

// goneEngine marks a closed worker's engine: its blocks went with it.
type goneEngine struct{}

// transferHolds are a prefill worker's pins on the blocks of prefill legs that a decode worker
// has not pulled yet.
type transferHolds struct {
	mu sync.Mutex
	m  map[string]*transferHold // by request id
}

type transferHold struct {
	pin    kvcache.Pin
	cancel context.CancelFunc // ends the timer
}

// hold pins the prompt's computed blocks (hashes) for request id until a decode leg pulls them,
// KVTransferHold passes (simulated time; wall time when TimeScale is 0, so that a worker that
// never sleeps still lets its holds go), or the worker closes. It returns the number of blocks
// held.
func (w *Worker) hold(id string, hashes []uint64) int {
	w.eng.mu.Lock()
	_, pin := w.eng.cache.Acquire(hashes, len(hashes))
	w.eng.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	h := &transferHold{pin: pin, cancel: cancel}
	w.holds.mu.Lock()
	if w.holds.m == nil {
		w.holds.m = make(map[string]*transferHold)
	}
	w.holds.m[id] = h
	w.holds.mu.Unlock()
	go func() {
		defer cancel()
		d := w.cfg.KVTransferHold
		if w.cfg.TimeScale > 0 {
			d = time.Duration(float64(d) * w.cfg.TimeScale)
		}
		waitOr(ctx, w.done, func(ctx context.Context) error { return w.clock.Sleep(ctx, d) })
		w.release(id)
	}()
	return pin.Len()
}

// release ends the hold of request id, if it is still held; it reports whether it was.
func (w *Worker) release(id string) bool {
	w.holds.mu.Lock()
	h, ok := w.holds.m[id]
	delete(w.holds.m, id)
	w.holds.mu.Unlock()
	if !ok {
		return false
	}
	h.cancel()
	w.eng.mu.Lock()
	w.eng.cache.Release(&h.pin)
	w.scheduleLocked() // the blocks may let a waiting request in
	w.eng.mu.Unlock()
	return true
}

// releaseAll ends every hold, when the worker closes.
func (w *Worker) releaseAll() {
	w.holds.mu.Lock()
	ids := make([]string, 0, len(w.holds.m))
	for id := range w.holds.m {
		ids = append(ids, id)
	}
	w.holds.mu.Unlock()
	for _, id := range ids {
		w.release(id)
	}
}

// pull takes the prefill's blocks for a decode leg. It is false only when the named engine lives
// in this process and no longer holds the request: the blocks are gone.
func pull(t transfer) bool {
	v, ok := engines.Load(t.engineID)
	if !ok {
		return true // another process: nothing here says the transfer failed
	}
	w, live := v.(*Worker)
	return live && w.release(t.requestID)
}

// pullable reports, without taking anything, whether pull would find the blocks, so that a
// decode leg under KVLoadFail is refused before its answer starts.
func pullable(t transfer) bool {
	v, ok := engines.Load(t.engineID)
	if !ok {
		return true
	}
	w, live := v.(*Worker)
	if !live {
		return false
	}
	w.holds.mu.Lock()
	defer w.holds.mu.Unlock()
	_, held := w.holds.m[t.requestID]
	return held
}

// refuseLostTransfer answers 500 for a decode leg whose blocks are gone, under KVLoadFail. It
// reports whether it did.
func (w *Worker) refuseLostTransfer(rw http.ResponseWriter, t transfer) bool {
	if t.role != decodeLeg || w.cfg.KVLoadFailurePolicy != KVLoadFail || pullable(t) {
		return false
	}
	w.count(func(s *Stats) { s.TransferFailures++ })
	w.writeError(rw, http.StatusInternalServerError, "kv_transfer_params: the KV blocks of request "+t.requestID+" on engine "+t.engineID+" are gone (kv_load_failure_policy fail)")
	return true
}

// handoffParams are the kv_transfer_params a prefill leg answers with: they name this engine and
// the request whose blocks it holds, at the address the request came in on.
func (w *Worker) handoffParams(r *http.Request, requestID string, blocks int) *kvTransferParams {
	host, port := "", 0
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if h, p, err := net.SplitHostPort(a.String()); err == nil {
			host = h
			port, _ = strconv.Atoi(p)
		}
	}
	ids := make([]int, blocks)
	for i := range ids {
		ids[i] = i
	}
	engine := w.engineID
	return &kvTransferParams{
		DoRemotePrefill: true,
		RemoteEngineID:  &engine,
		RemoteBlockIDs:  ids,
		RemoteRequestID: &requestID,
		RemoteHost:      &host,
		RemotePort:      &port,
		TPSize:          1,
	}
}

// waitOr runs sleep until it returns or done closes, whichever comes first.
func waitOr(ctx context.Context, done <-chan struct{}, sleep func(context.Context) error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	_ = sleep(ctx)
}
