package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/responsesearch"
	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The agent protocols through the proxy: stored responses followed to their worker, the id
// routes, Anthropic error bodies, load-only routes, multipart bodies.

// responsesWorker is a worker that stores the responses it produces, in its own memory, as vLLM
// does: a previous_response_id or an id path it did not store gets 404.
type responsesWorker struct {
	*testkit.Server
	linger chan struct{} // when set, a stream stays open after its last event until it is closed
	name   string
	mu     sync.Mutex
	ids    map[string]bool
	n      int
}

func newResponsesWorker(t *testing.T, name string) *responsesWorker {
	rw := &responsesWorker{name: name, ids: map[string]bool{}}
	rw.Server = testkit.NewServer(t, rw.serve)
	return rw
}

func (rw *responsesWorker) has(id string) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.ids[id]
}

func (rw *responsesWorker) store(id string) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.ids[id] = true
}

func (rw *responsesWorker) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	notFound := func(id string) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","code":404}}`, id)
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
		id, _, _ = strings.Cut(id, "/")
		if !rw.has(id) {
			notFound(id)
			return
		}
		if r.Method == http.MethodDelete {
			rw.mu.Lock()
			delete(rw.ids, id)
			rw.mu.Unlock()
			fmt.Fprintf(w, `{"id":%q,"object":"response","deleted":true}`, id)
			return
		}
		fmt.Fprintf(w, `{"id":%q,"object":"response","worker":%q}`, id, rw.name)
		return
	}
	var req struct {
		Previous string `json:"previous_response_id"`
		Stream   bool   `json:"stream"`
		Store    *bool  `json:"store"`
	}
	_ = json.Unmarshal(body, &req)
	if req.Previous != "" && !rw.has(req.Previous) {
		notFound(req.Previous)
		return
	}
	rw.mu.Lock()
	rw.n++
	id := fmt.Sprintf("resp_%s_%d", rw.name, rw.n)
	rw.mu.Unlock()
	if req.Store == nil || *req.Store {
		rw.store(id)
	}
	if !req.Stream {
		fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","worker":%q}`, id, rw.name)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":%q,\"status\":\"in_progress\"}}\n\n", id)
	w.(http.Flusher).Flush()
	fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":%q,\"status\":\"completed\"}}\n\n", id)
	if rw.linger != nil {
		w.(http.Flusher).Flush()
		select {
		case <-rw.linger:
		case <-r.Context().Done():
		}
	}
}

// responseID is the id of the response in a non-streamed answer or a stream.
func responseID(t *testing.T, body string) string {
	t.Helper()
	s := sniff.NewResponseID(strings.HasPrefix(body, "event:"))
	s.Feed([]byte(body))
	id := s.Result()
	if id == "" {
		t.Fatalf("no response id in %q", body)
	}
	return id
}

func cacheAwarePolicy() *cacheaware.Policy {
	return cacheaware.New(cacheaware.Options{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5,
		MaxTreeSize: 1 << 20, EvictionInterval: time.Minute, SessionTTL: time.Hour, MaxSessions: 1000}, nil, slog.New(slog.DiscardHandler))
}

// responsesWorkers starts n responses workers, named w0, w1, …, and returns them and their URLs.
func responsesWorkers(t *testing.T, n int) ([]*responsesWorker, []string) {
	var ws []*responsesWorker
	var urls []string
	for i := range n {
		w := newResponsesWorker(t, fmt.Sprint("w", i))
		ws = append(ws, w)
		urls = append(urls, w.URL)
	}
	return ws, urls
}

// responsesFleet is a router with cache_aware over n responses workers.
func responsesFleet(t *testing.T, n int) (*testProxy, []*responsesWorker, *cacheaware.Policy) {
	ws, urls := responsesWorkers(t, n)
	p := cacheAwarePolicy()
	return newTestProxy(t, setup{urls: urls, policy: p}), ws, p
}

func TestStoredResponseIsLearnedFromJSONAndStreamAnswers(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			tp, _, p := responsesFleet(t, 3)
			status, h, body := tp.post(t, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"hi","stream":%v}`, stream))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			id := responseID(t, body)
			tenant, ok := p.ResponseHolder(t.Context(), id)
			if !ok || tenant != tp.worker(t, h.Get(HeaderWorker)).ID() {
				t.Fatalf("holder of %s: %q %v, want the worker that answered (%s)", id, tenant, ok, h.Get(HeaderWorker))
			}
		})
	}
}

func TestResponseNotStoredIsNotLearned(t *testing.T) {
	tp, _, p := responsesFleet(t, 2)
	_, _, body := tp.post(t, "/v1/responses", `{"model":"m","input":"hi","store":false}`)
	if _, ok := p.ResponseHolder(t.Context(), responseID(t, body)); ok {
		t.Fatal("a response stored nowhere was learned")
	}
}

func TestResponseIDRoutesGoToTheWorkerThatStoredIt(t *testing.T) {
	tp, ws, _ := responsesFleet(t, 3)
	_, h, body := tp.post(t, "/v1/responses", `{"model":"m","input":"hi"}`)
	id := responseID(t, body)
	var holder *responsesWorker
	for _, w := range ws {
		if w.URL == h.Get(HeaderWorker) {
			holder = w
		}
	}
	before := map[*responsesWorker]int64{}
	for _, w := range ws {
		before[w] = w.Hits.Load()
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + id},
		{http.MethodGet, "/v1/responses/" + id + "/input_items"},
		{http.MethodPost, "/v1/responses/" + id + "/cancel"},
	} {
		status, h, body := tp.do(t, c.method, c.path)
		if status != http.StatusOK || h.Get(HeaderDecision) != labelResponseHolder {
			t.Fatalf("%s %s: %d %s %s", c.method, c.path, status, h.Get(HeaderDecision), body)
		}
	}
	for _, w := range ws {
		want := before[w]
		if w == holder {
			want += 3
		}
		if got := w.Hits.Load(); got != want {
			t.Errorf("worker %s got %d requests, want %d: id routes must go to the holder alone", w.name, got-before[w], want-before[w])
		}
	}
}

func TestUnknownResponseIDIsAskedOfEveryWorkerThenRemembered(t *testing.T) {
	tp, ws, p := responsesFleet(t, 3)
	ws[2].store("resp_from_elsewhere") // stored before this router knew of it
	status, h, body := tp.do(t, http.MethodGet, "/v1/responses/resp_from_elsewhere")
	if status != http.StatusOK || h.Get(HeaderDecision) != labelResponseSearch || h.Get(HeaderWorker) != ws[2].URL {
		t.Fatalf("search: %d %s on %s: %s", status, h.Get(HeaderDecision), h.Get(HeaderWorker), body)
	}
	if tenant, ok := p.ResponseHolder(t.Context(), "resp_from_elsewhere"); !ok || tenant != tp.worker(t, ws[2].URL).ID() {
		t.Fatalf("the search's find was not remembered: %q %v", tenant, ok)
	}
	if _, h, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_from_elsewhere"); h.Get(HeaderDecision) != labelResponseHolder {
		t.Fatalf("second lookup: %s, want %s", h.Get(HeaderDecision), labelResponseHolder)
	}
	if n := tp.upstreamErrors("status_5xx"); n != 0 {
		t.Fatalf("the workers' 404s were counted as %v upstream errors", n)
	}
	for _, w := range ws {
		if !tp.worker(t, w.URL).Breaker().Allows() {
			t.Fatal("a worker's 404 for an id it does not hold opened its breaker")
		}
	}
}

func TestResponseIDNowhereIsTheWorkers404(t *testing.T) {
	tp, ws, _ := responsesFleet(t, 3)
	status, _, body := tp.do(t, http.MethodGet, "/v1/responses/resp_nowhere")
	if status != http.StatusNotFound || !strings.Contains(body, "resp_nowhere") {
		t.Fatalf("%d %s, want the worker's 404", status, body)
	}
	for _, w := range ws {
		if w.Hits.Load() != 1 {
			t.Fatalf("worker %s asked %d times, want once each", w.name, w.Hits.Load())
		}
	}
}

func TestResponseIDNoWorkerHadIsAnsweredAtOnceForAWhile(t *testing.T) {
	tp, ws, _ := responsesFleet(t, 3)
	hits := func() int64 { return ws[0].Hits.Load() + ws[1].Hits.Load() + ws[2].Hits.Load() }
	if status, _, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_nowhere"); status != http.StatusNotFound || hits() != 3 {
		t.Fatalf("first GET: %d with %d worker calls, want the workers' 404 after asking all 3", status, hits())
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/resp_nowhere"},
		{http.MethodDelete, "/v1/responses/resp_nowhere"},
		{http.MethodGet, "/v1/responses/resp_nowhere/input_items"},
	} {
		status, h, body := tp.do(t, c.method, c.path)
		if status != http.StatusNotFound || h.Get(HeaderDecision) != labelResponseMiss || errorCode(t, body) != "response_not_found" {
			t.Fatalf("%s %s again: %d %s %s, want 404 %s", c.method, c.path, status, h.Get(HeaderDecision), body, labelResponseMiss)
		}
	}
	if hits() != 3 {
		t.Fatalf("the repeats cost %d more worker calls, want none", hits()-3)
	}
	// Another id is still searched for, and a remembered miss ends: its expiry is checked by the clock it was given.
	if _, h, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_other"); h.Get(HeaderDecision) != labelResponseSearch {
		t.Fatalf("another unknown id: %s, want a search", h.Get(HeaderDecision))
	}
	if !tp.Server.search.Missed("resp_nowhere", time.Now()) || tp.Server.search.Missed("resp_nowhere", time.Now().Add(responsesearch.MissTTL+time.Second)) {
		t.Fatal("a miss is not remembered, or remembered past its time")
	}
}

func TestResponseSearchWithAFailedWorkerIsNotRemembered(t *testing.T) {
	tp, ws, _ := responsesFleet(t, 2)
	tp.worker(t, ws[0].URL).SetHealthy(true)
	ws[0].Close() // it cannot answer: the search does not know whether it holds the id
	if status, _, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_maybe"); status != http.StatusNotFound {
		t.Fatalf("GET: %d, want the other worker's 404", status)
	}
	if tp.Server.search.Missed("resp_maybe", time.Now()) {
		t.Fatal("a search in which a worker failed was remembered as a miss")
	}
}

func TestDeletedResponseIsForgotten(t *testing.T) {
	tp, _, p := responsesFleet(t, 2)
	_, _, body := tp.post(t, "/v1/responses", `{"model":"m","input":"hi"}`)
	id := responseID(t, body)
	if status, _, body := tp.do(t, http.MethodDelete, "/v1/responses/"+id); status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	if _, ok := p.ResponseHolder(t.Context(), id); ok {
		t.Fatal("a deleted response is still mapped to its worker")
	}
}

// storedOnARemovedWorker has a worker store a response, then removes that worker from the pool
// and tells p, and returns the response's id.
func storedOnARemovedWorker(t *testing.T, tp *testProxy, p *cacheaware.Policy) string {
	t.Helper()
	_, h, body := tp.post(t, "/v1/responses", `{"model":"m","input":"hi"}`)
	url := h.Get(HeaderWorker)
	if _, err := tp.Pool.Remove(url); err != nil {
		t.Fatal(err)
	}
	p.WorkerRemoved(url)
	return responseID(t, body)
}

func TestResponseOfARemovedWorkerIsNotFoundWithoutAskingAnyone(t *testing.T) {
	tp, ws, p := responsesFleet(t, 2)
	id := storedOnARemovedWorker(t, tp, p)
	hits := ws[0].Hits.Load() + ws[1].Hits.Load()
	status, _, body := tp.do(t, http.MethodGet, "/v1/responses/"+id)
	if status != http.StatusNotFound || errorCode(t, body) != "response_not_found" {
		t.Fatalf("%d %s, want the router's 404", status, body)
	}
	if ws[0].Hits.Load()+ws[1].Hits.Load() != hits {
		t.Fatal("a worker was asked for a response whose worker left")
	}
}

func TestMessagesRouteAnswersInAnthropicsErrorShape(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}})
	status, _, body := tp.post(t, "/v1/messages", `{"model":`)
	if status != http.StatusBadRequest || anthropicErrorType(t, body) != "invalid_request_error" {
		t.Fatalf("malformed body: %d %s", status, body)
	}
	tp.worker(t, tp.Pool.URLs()[0]).SetHealthy(false)
	status, h, body := tp.post(t, "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	if status != 529 || anthropicErrorType(t, body) != "overloaded_error" || h.Get(HeaderRetryAfter) == "" {
		t.Fatalf("no worker: %d %s, want 529 overloaded_error with Retry-After", status, body)
	}
	if n := testutil.ToFloat64(tp.Metrics.Requests.WithLabelValues("/v1/messages", "5xx")); n != 1 {
		t.Fatalf("requests_total{5xx} = %v, want 1", n)
	}
}

// Anthropic's "overloaded" status has no standard reason phrase; its status line says what it
// means, as Anthropic's own does, rather than "Unknown Status Code".
func TestMessagesRoutes529StatusLineReadsOverloaded(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}})
	tp.worker(t, tp.Pool.URLs()[0]).SetHealthy(false)
	c := tp.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if want := "HTTP/1.1 529 Overloaded\r\n"; line != want {
		t.Errorf("status line %q, want %q", line, want)
	}
}

func TestLoadOnlyRoutesTeachThePolicyNothing(t *testing.T) {
	p := cacheAwarePolicy()
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "a").URL, okWorker(t, "b").URL}, policy: p})
	long := strings.Repeat("a prompt long enough to be worth matching ", 20)
	for _, path := range []string{"/tokenize", "/detokenize", "/v1/embeddings", "/v1/score", "/rerank", "/pooling", "/classify", "/v1/messages/count_tokens"} {
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"input":%q,"messages":[{"role":"user","content":%q}]}`, long, long, long)
		if status, _, body := tp.post(t, path, body, "x-session-id", "s1"); status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, status, body)
		}
	}
	if n := p.TreeChars(); n != 0 {
		t.Fatalf("the tree learned %d chars from load-only routes", n)
	}
	if n := p.Sessions()["m"]; n != 0 {
		t.Fatalf("the session map learned %d sessions from load-only routes", n)
	}
}

func TestAudioBodyIsForwardedAsItCameWithItsFormModel(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"text":"ok"}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	var body bytes.Buffer
	form := multipart.NewWriter(&body)
	_ = form.WriteField("model", "whisper")
	f, _ := form.CreateFormFile("file", "a.wav")
	_, _ = f.Write(bytes.Repeat([]byte{0, 1, 2, 3}, 4096))
	_ = form.Close()
	req, _ := http.NewRequest(http.MethodPost, tp.URL+"/v1/audio/transcriptions", bytes.NewReader(body.Bytes()))
	req.Header.Set("Content-Type", form.FormDataContentType())
	resp, err := tp.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := w.lines(); resp.StatusCode != http.StatusOK || len(got) != 1 || got[0] != "POST /v1/audio/transcriptions "+body.String() {
		t.Fatalf("status %d; worker got %d requests, want the one sent, its %d-byte body as it came", resp.StatusCode, len(got), body.Len())
	}

	r, err := readMultipart(req.Header, body.Bytes())
	if err != nil || r.Model != "whisper" {
		t.Fatalf("model %v %v, want whisper", r, err)
	}
	if _, err := readMultipart(http.Header{"Content-Type": {"application/json"}}, []byte(`{}`)); err == nil {
		t.Fatal("a JSON body on a multipart route was accepted")
	}
}

func TestClientsAnthropicKeyIsNotReplacedByTheRoutersKey(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	opts := testOptions()
	opts.Upstream.APIKey = "router-key"
	tp := newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts})
	msg := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	tp.post(t, "/v1/messages", msg, "x-api-key", "client-key")
	tp.post(t, "/v1/messages", msg)
	if auth := w.headerValues("Authorization"); len(auth) != 2 || auth[0] != "" || auth[1] != "Bearer router-key" {
		t.Fatalf("Authorization sent upstream: %q, want none beside the client's x-api-key, then the router's key", auth)
	}
}

// chain sends turns Responses requests, each continuing the previous one's response, and returns
// their statuses and the workers that answered.
func chain(t *testing.T, tp *testProxy, turns int) (statuses []int, served []string) {
	prev := ""
	for i := range turns {
		body := fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v}`, i, i%2 == 1)
		if prev != "" {
			body = fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v,"previous_response_id":%q}`, i, i%2 == 1, prev)
		}
		status, h, answer := tp.post(t, "/v1/responses", body)
		statuses, served = append(statuses, status), append(served, h.Get(HeaderWorker))
		if status == http.StatusOK {
			prev = responseID(t, answer)
		}
	}
	return statuses, served
}

func TestResponsesChainStaysOnTheWorkerThatStoredEachResponse(t *testing.T) {
	tp, _, _ := responsesFleet(t, 4)
	statuses, served := chain(t, tp, 8)
	for i := range statuses {
		if statuses[i] != http.StatusOK || served[i] != served[0] {
			t.Fatalf("turn %d: %d on %s, want 200 on %s (all: %v %v)", i, statuses[i], served[i], served[0], statuses, served)
		}
	}
	if n := testutil.ToFloat64(tp.Metrics.CacheAwareDecisions.WithLabelValues(cacheaware.LabelResponseMatch)); n != 7 {
		t.Fatalf("response_id_match counted %v times, want 7", n)
	}
}

func TestResponsesChainScattersWithoutAPolicyThatFollowsIDs(t *testing.T) {
	var urls []string
	for i := range 4 {
		urls = append(urls, newResponsesWorker(t, fmt.Sprint("w", i)).URL)
	}
	tp := newTestProxy(t, setup{urls: urls}) // round robin
	statuses, _ := chain(t, tp, 4)
	if statuses[1] != http.StatusNotFound {
		t.Fatalf("statuses %v: the second turn reached the worker that stored the first under round robin", statuses)
	}
}

func TestContinuingAResponseOfARemovedWorkerIsRefusedAt404(t *testing.T) {
	tp, ws, p := responsesFleet(t, 2)
	id := storedOnARemovedWorker(t, tp, p)
	hits := ws[0].Hits.Load() + ws[1].Hits.Load()
	status, h, body := tp.post(t, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"more","previous_response_id":%q}`, id))
	if status != http.StatusNotFound || h.Get(HeaderDecision) != cacheaware.LabelResponseGone || errorCode(t, body) != "response_not_found" {
		t.Fatalf("%d %s %s, want 404 response_id_gone", status, h.Get(HeaderDecision), body)
	}
	if ws[0].Hits.Load()+ws[1].Hits.Load() != hits {
		t.Fatal("the turn was sent to a worker that cannot know the response")
	}
	if n := testutil.ToFloat64(tp.Metrics.CacheAwareDecisions.WithLabelValues(cacheaware.LabelResponseGone)); n != 1 {
		t.Fatalf("response_id_gone counted %v times, want 1", n)
	}
}

func TestTurnSentAsSoonAsTheStreamCompletedFindsItsResponse(t *testing.T) {
	var ws []*responsesWorker
	var urls []string
	linger := make(chan struct{})
	defer close(linger)
	for i := range 4 {
		w := newResponsesWorker(t, fmt.Sprint("w", i))
		w.linger = linger
		ws, urls = append(ws, w), append(urls, w.URL)
	}
	tp := newTestProxy(t, setup{urls: urls, policy: cacheAwarePolicy()})
	resp, err := tp.Client.Post(tp.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hi","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// Read up to the completed event only: the stream itself stays open, as a client that acts
	// on response.completed does not wait for its end.
	var events bytes.Buffer
	buf := make([]byte, 512)
	for !strings.Contains(events.String(), "response.completed") {
		n, err := resp.Body.Read(buf)
		events.Write(buf[:n])
		if err != nil {
			t.Fatalf("stream ended before response.completed: %v (%q)", err, events.String())
		}
	}
	id := responseID(t, events.String())
	status, h, body := tp.post(t, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"next","previous_response_id":%q}`, id))
	if status != http.StatusOK || h.Get(HeaderDecision) != cacheaware.LabelResponseMatch || h.Get(HeaderWorker) != resp.Header.Get(HeaderWorker) {
		t.Fatalf("next turn: %d %s on %s, want response_id_match on %s: %s", status, h.Get(HeaderDecision), h.Get(HeaderWorker), resp.Header.Get(HeaderWorker), body)
	}
}
