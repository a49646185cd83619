package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
)

// HeaderWorker names the response header that carries the serving worker's
// host:port on every response, so tests and demos can see who answered.
const HeaderWorker = "x-sim-worker"

// maxBodyBytes bounds a request body.
const maxBodyBytes = 64 << 20

// Worker is one simulated vLLM worker: an http.Handler with its own KV cache,
// scheduler and metrics registry. It is safe for concurrent use.
type Worker struct {
	cfg     Config
	clock   Clock
	eng     engine
	sched   scheduler // guarded by eng.mu
	metrics *workerMetrics
	mux     *http.ServeMux
	models  map[string]bool // the base models
	loras   *adapters
	stored  *responseStore
	events  *eventPublisher // nil unless cfg.KVEvents.Endpoint is set

	// engineID names the worker in the kv_transfer_params of its prefill legs (pd.go).
	engineID string
	holds    transferHolds
	// prefilling is the number of prompt tokens being computed now, which slow the decode
	// steps of every other running request when MaxNumBatchedTokens is set.
	prefilling atomic.Int64

	name     atomic.Pointer[string]
	onResult atomic.Pointer[func(Result)]

	faultMu  sync.Mutex
	faultRNG *rand.Rand

	done      chan struct{}
	closeOnce sync.Once
}

// NewWorker validates cfg and returns a worker ready to serve.
func NewWorker(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Models = append([]string(nil), cfg.Models...)
	cfg.LoRAModules = append([]LoRAModule(nil), cfg.LoRAModules...)
	w := &Worker{
		cfg:      cfg,
		clock:    cfg.Clock,
		sched:    newScheduler(cfg.MaxNumSeqs),
		eng:      engine{cache: kvcache.New(cfg.KVCacheBlocks)},
		models:   make(map[string]bool, len(cfg.Models)),
		loras:    &adapters{max: cfg.maxLoRAs()},
		stored:   newResponseStore(maxStoredResponses, maxStoredBytes),
		faultRNG: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)),
		done:     make(chan struct{}),
		engineID: newID("engine-"),
	}
	if w.clock == nil {
		w.clock = wallClock{}
	}
	for _, m := range cfg.Models {
		w.models[m] = true
	}
	for _, m := range cfg.LoRAModules {
		parent := m.Base
		if parent == "" {
			parent = cfg.Models[0]
		}
		if _, err := w.loras.load(m.Name, m.Path, parent); err != nil {
			return nil, fmt.Errorf("sim: lora module %q: %w", m.Name, err) // Validate rules it out
		}
	}
	w.metrics = newWorkerMetrics(w)
	if err := w.startEvents(); err != nil {
		return nil, err
	}
	engines.Store(w.engineID, w)

	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.ChatPath, w.handleChat)
	mux.HandleFunc("POST "+protocol.CompletionsPath, w.handleCompletion)
	mux.HandleFunc("POST /v1/embeddings", w.handleEmbeddings)
	mux.HandleFunc("POST "+protocol.ResponsesPath, w.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", w.handleGetResponse)
	mux.HandleFunc("DELETE /v1/responses/{id}", w.handleDeleteResponse)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", w.handleCancelResponse)
	mux.HandleFunc("GET /v1/responses/{id}/input_items", w.handleResponseInputItems)
	mux.HandleFunc("POST "+protocol.MessagesPath, w.handleMessages)
	mux.HandleFunc("POST "+protocol.CountTokensPath, w.handleCountTokens)
	mux.HandleFunc("GET /v1/models", w.handleModels)
	mux.HandleFunc("POST /v1/load_lora_adapter", w.handleLoadLoRA)
	mux.HandleFunc("POST /v1/unload_lora_adapter", w.handleUnloadLoRA)
	mux.HandleFunc("POST /tokenize", w.handleTokenize)
	mux.HandleFunc("POST /v1/chat/completions/render", w.handleChatRender)
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /reset_prefix_cache", func(http.ResponseWriter, *http.Request) { w.ResetPrefixCache() })
	mux.Handle("GET /metrics", promhttp.HandlerFor(w.metrics.reg, promhttp.HandlerOpts{}))
	w.mux = mux
	return w, nil
}

// Config returns the worker's configuration.
func (w *Worker) Config() Config { return w.cfg }

// SetName sets the value of the x-sim-worker header. Without it the header
// carries the local address of the connection the request came in on.
func (w *Worker) SetName(name string) { w.name.Store(&name) }

// OnResult sets a function that receives the Result of every generation
// request as it ends; nil removes it. It runs on the request's goroutine.
func (w *Worker) OnResult(fn func(Result)) {
	if fn == nil {
		w.onResult.Store(nil)
		return
	}
	w.onResult.Store(&fn)
}

// ServeHTTP serves the vLLM-compatible API.
func (w *Worker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	rw.Header().Set(HeaderWorker, w.workerName(r))
	w.mux.ServeHTTP(rw, r)
}

func (w *Worker) workerName(r *http.Request) string {
	if n := w.name.Load(); n != nil {
		return *n
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return a.String()
	}
	return r.Host
}

// ResetPrefixCache empties the prefix cache, as vLLM's /reset_prefix_cache
// does. Blocks that running requests hold are dropped when they finish.
func (w *Worker) ResetPrefixCache() {
	w.eng.mu.Lock()
	w.eng.cache.Reset()
	w.publishChanges(nil, nil, adapter{})
	w.eng.mu.Unlock()
}

// Stats returns a snapshot of the worker's counters and state.
func (w *Worker) Stats() Stats {
	w.eng.mu.Lock()
	s := w.eng.stats
	s.CachedBlocks = w.eng.cache.Resident()
	s.PinnedBlocks = w.eng.cache.Pinned()
	s.CapacityBlocks = w.eng.cache.Capacity()
	s.Evictions = w.eng.cache.Evictions()
	s.Running, s.Waiting = len(w.sched.running), len(w.sched.waiting)
	w.eng.mu.Unlock()
	s.StoredResponses = w.stored.len()
	return s
}

// Close releases requests that fault injection stalls and the blocks held for
// KV transfers, and takes the worker's engine out of reach of decode legs
// (which then compute the prompt themselves). The worker keeps serving;
// stopping the listener is the server's business.
func (w *Worker) Close() {
	w.closeOnce.Do(func() {
		close(w.done)
		engines.Store(w.engineID, goneEngine{})
		w.releaseAll()
		w.stopEvents()
	})
}

// drawFault decides whether the next generation request fails, and how.
func (w *Worker) drawFault() string {
	if w.cfg.FailureRate == 0 {
		return ""
	}
	w.faultMu.Lock()
	x := w.faultRNG.Float64()
	w.faultMu.Unlock()
	if x < w.cfg.FailureRate {
		return w.cfg.FailureMode
	}
	return ""
}

// readBody reads the bounded request body.
func readBody(rw http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, badf("request body larger than %d bytes", maxBodyBytes)
		}
		return nil, badf("reading request body: %v", err)
	}
	return body, nil
}

// readJSON reads the bounded request body and decodes it into v: every failure is a badRequest
// that says what was wrong.
func readJSON(rw http.ResponseWriter, r *http.Request, v any) error {
	body, err := readBody(rw, r)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// resolveModel returns the model a request names; an empty name means the
// first served model.
func (w *Worker) resolveModel(name string) (string, bool) {
	if name == "" {
		return w.cfg.Models[0], true
	}
	if w.models[name] {
		return name, true
	}
	_, ok := w.loras.get(name)
	return name, ok
}

// lora returns the adapter a request for model runs with; the zero adapter (no name) for a base
// model. The block hashes of its prompt chain from kvcache.Root of its name.
func (w *Worker) lora(model string) adapter {
	if w.models[model] {
		return adapter{}
	}
	if ad, ok := w.loras.get(model); ok {
		return ad
	}
	return adapter{name: model} // unloaded since the request was admitted: still its own blocks
}

// maxModelLen is the context length the worker serves: MaxModelLen, or what its KV cache holds
// when that is less. vLLM does not start with a max_model_len its KV cache cannot hold for one
// request (it names the length that would fit), so a prompt longer than the whole cache gets the
// context-length error there too, never a wait that could not end.
func (w *Worker) maxModelLen() int {
	return min(w.cfg.MaxModelLen, w.cfg.KVCacheBlocks*w.cfg.BlockSize)
}

// fitContext checks a prompt against maxModelLen and shortens maxTokens to
// the room left.
func (w *Worker) fitContext(promptTokens, maxTokens int) (int, error) {
	limit := w.maxModelLen()
	if promptTokens >= limit {
		return 0, badf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, promptTokens)
	}
	return min(maxTokens, limit-promptTokens), nil
}

// writeError writes a vLLM-style error body of the type vLLM gives code.
func (w *Worker) writeError(rw http.ResponseWriter, code int, msg string) {
	w.writeTypedError(rw, code, openAIErrorType(code), msg)
}

// openAIErrorType is the error type vLLM's OpenAI-compatible server names for status code.
func openAIErrorType(code int) string {
	switch {
	case code == http.StatusNotFound:
		return "NotFoundError"
	case code >= 500:
		return "InternalServerError"
	}
	return "BadRequestError"
}

// errorStatus is the answer an error met while serving a request gets: a badRequest is the
// client's, a 400 with its message; anything else is the worker's, a 500 with err's text.
func errorStatus(err error) (code int, msg string) {
	var bad *badRequest
	if errors.As(err, &bad) {
		return http.StatusBadRequest, bad.msg
	}
	return http.StatusInternalServerError, err.Error()
}

// writeOpenAIError writes an error in OpenAI's nested shape, the one vLLM's
// Responses API answers with:
//
//	{"error":{"message":"...","type":"invalid_request_error","param":null,"code":404}}
func (w *Worker) writeOpenAIError(rw http.ResponseWriter, code int, typ, msg string) {
	if code < 500 {
		w.count(func(s *Stats) { s.Rejected++ })
	}
	writeJSON(rw, code, struct {
		Error errorInfo `json:"error"`
	}{errorInfo{Message: msg, Type: typ, Param: nil, Code: code}})
}

// writeAnthropicError writes an error in the Anthropic Messages API's shape:
//
//	{"type":"error","error":{"type":"invalid_request_error","message":"..."}}
func (w *Worker) writeAnthropicError(rw http.ResponseWriter, code int, typ, msg string) {
	if code < 500 {
		w.count(func(s *Stats) { s.Rejected++ })
	}
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	writeJSON(rw, code, struct {
		Type  string `json:"type"`
		Error detail `json:"error"`
	}{"error", detail{typ, msg}})
}

// writeClientError reports err as 400 when it is a badRequest, else 500.
func (w *Worker) writeClientError(rw http.ResponseWriter, err error) {
	code, msg := errorStatus(err)
	w.writeError(rw, code, msg)
}

func (w *Worker) writeUnknownModel(rw http.ResponseWriter, model string) {
	w.writeError(rw, http.StatusNotFound, "The model `"+model+"` does not exist.")
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	writeRawJSON(rw, code, b)
}

// writeRawJSON writes b, a JSON document, as the response body.
func writeRawJSON(rw http.ResponseWriter, code int, b []byte) {
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Content-Length", strconv.Itoa(len(b)))
	rw.WriteHeader(code)
	rw.Write(b)
}

// injectFault carries out a fault that ends a request before it runs and
// reports whether it did; fail500 writes a 500 answer in the route's error
// shape. FailStall and FailSlow act inside generate.
func (w *Worker) injectFault(rw http.ResponseWriter, fault string, fail500 func(rw http.ResponseWriter, msg string)) bool {
	switch fault {
	case FailHTTP500:
		w.count(func(s *Stats) { s.Failed++ })
		fail500(rw, "simulated failure")
		return true
	case FailReset:
		w.count(func(s *Stats) { s.Failed++ })
		conn, _, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			// Not hijackable (HTTP/2, recorders): abort the response instead.
			panic(http.ErrAbortHandler)
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // send RST, not FIN
		}
		conn.Close()
		return true
	}
	return false
}

// fail500 writes a 500 in vLLM's error shape, for the chat and completion
// routes.
func (w *Worker) fail500(rw http.ResponseWriter, msg string) {
	w.writeError(rw, http.StatusInternalServerError, msg)
}

// unixNow is the "created" field of responses.
func unixNow() int64 { return time.Now().Unix() }

// newID returns a response id with the given prefix.
func newID(prefix string) string {
	return prefix + strconv.FormatUint(rand.Uint64(), 16)
}
