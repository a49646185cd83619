package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// answer is what a client got: a status, a Retry-After and a body; or an error.
type answer struct {
	status     int
	retryAfter string
	body       string
	err        error
}

// postAsync sends body to path on a connection of its own (a transport of its own) and delivers
// the answer on the channel.
func (tr *testRouter) postAsync(path, body string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		transport := &http.Transport{}
		defer transport.CloseIdleConnections()
		client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
		resp, err := client.Post(tr.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
	}()
	return out
}

func receive(t *testing.T, what string, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer", what)
	}
	return answer{}
}

// shutdownWithAQueue starts a router with one admission place, taken by a request its worker
// holds until release is closed, and two more requests waiting in the queue (one OpenAI, one
// Anthropic); then it asks the router to stop, with a short grace. release lets the worker
// answer; it is called at the test's end in any case.
func shutdownWithAQueue(t *testing.T) (tr *testRouter, release func(), held, chat, messages <-chan answer) {
	t.Helper()
	gate := make(chan struct{})
	release = sync.OnceFunc(func() { close(gate) })
	w := newFakeWorker(t)
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		<-gate
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"id":"cmpl-1","object":"chat.completion","choices":[]}`)
	})
	cfg := testConfig()
	cfg.MaxConcurrentRequests = 1
	cfg.ShutdownGraceSecs = 0.3
	tr = startRouter(t, cfg, w)
	t.Cleanup(release) // before the router's and the worker's cleanups, which wait for the request
	held = tr.postAsync("/v1/chat/completions", chatBody)
	testkit.WaitFor(t, "the first request at the worker", func() bool { return w.hits.Load() == 1 })
	chat = tr.postAsync("/v1/chat/completions", chatBody)
	messages = tr.postAsync("/v1/messages", `{"model":"test-model","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	testkit.WaitFor(t, "two requests queued", func() bool { return tr.admission.Controller.Queued() == 2 })
	tr.cancel()
	return tr, release, held, chat, messages
}

// checkQueuedAnswers checks the queued requests' answers: 503 shutting_down (529 overloaded on
// the Anthropic route), each with Retry-After.
func checkQueuedAnswers(t *testing.T, chat, messages <-chan answer) {
	t.Helper()
	a := receive(t, "queued chat request", chat)
	var oe struct {
		Error struct{ Code string } `json:"error"`
	}
	if a.status != http.StatusServiceUnavailable || a.retryAfter == "" || json.Unmarshal([]byte(a.body), &oe) != nil || oe.Error.Code != "shutting_down" {
		t.Fatalf("queued chat request: %d, Retry-After %q, %s; want 503 shutting_down with Retry-After", a.status, a.retryAfter, a.body)
	}
	a = receive(t, "queued messages request", messages)
	var ae struct {
		Type  string
		Error struct{ Type string } `json:"error"`
	}
	if a.status != 529 || a.retryAfter == "" || json.Unmarshal([]byte(a.body), &ae) != nil || ae.Type != "error" || ae.Error.Type != "overloaded_error" {
		t.Fatalf("queued messages request: %d, Retry-After %q, %s; want 529 overloaded_error with Retry-After", a.status, a.retryAfter, a.body)
	}
}

// stopped waits for Serve to return, and leaves its result for the test's cleanup.
func (tr *testRouter) stopped(t *testing.T) error {
	t.Helper()
	select {
	case err := <-tr.done:
		tr.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the router did not stop")
	}
	return nil
}

func TestShutdown_QueuedRequestsGet503WhenTheGraceEndsAndTheDrainIsClean(t *testing.T) {
	tr, release, held, chat, messages := shutdownWithAQueue(t)
	checkQueuedAnswers(t, chat, messages)
	release() // the request with the worker ends after the grace, before the drain does
	if a := receive(t, "the request with the worker", held); a.status != http.StatusOK {
		t.Fatalf("the request with the worker: %d %s", a.status, a.body)
	}
	if err := tr.stopped(t); err != nil {
		t.Fatalf("every request was answered, yet Serve returned %v", err)
	}
}

func TestShutdown_ARequestStillWithItsWorkerWhenTheDrainEndsIsAnError(t *testing.T) {
	tr, _, _, chat, messages := shutdownWithAQueue(t)
	checkQueuedAnswers(t, chat, messages)
	if err := tr.stopped(t); err == nil {
		t.Fatal("a request was cut, yet Serve returned nil")
	}
}
