package router

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// localhostIsLoopback reports whether this machine resolves localhost to 127.0.0.1, as the
// spelling tests assume.
func localhostIsLoopback(t *testing.T) bool {
	addrs, err := net.DefaultResolver.LookupHost(t.Context(), "localhost")
	return err == nil && slices.Contains(addrs, "127.0.0.1")
}

// One worker added under several spellings is one worker: the static list keeps one of
// "127.0.0.1:P" and "localhost:P/", and the admin API answers every other spelling of it
// ("/x/..", upper case, a port with a leading zero, localhost) as it answers the same URL twice,
// 409 worker_exists, in its error shape.
func TestOneWorkerUnderSeveralSpellingsIsOneWorker(t *testing.T) {
	if !localhostIsLoopback(t) {
		t.Skip("localhost does not resolve to 127.0.0.1 here")
	}
	w := newFakeWorker(t)
	port := w.URL()[strings.LastIndexByte(w.URL(), ':')+1:]
	cfg := testConfig()
	cfg.WorkerURLs = []string{w.URL(), "http://localhost:" + port + "/"}
	tr := startRouter(t, cfg)
	tr.Start(t.Context())
	if urls := tr.Pool().URLs(); !slices.Equal(urls, []string{w.URL()}) {
		t.Fatalf("static workers %v, want one: %s", urls, w.URL())
	}

	other := newFakeWorker(t)
	resp := tr.post(t, "/workers", `{"url":"`+other.URL()+`"}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /workers: %d %s", resp.StatusCode, body)
	}
	otherPort := other.URL()[strings.LastIndexByte(other.URL(), ':')+1:]
	for _, spelling := range []string{other.URL(), other.URL() + "/x/..", "HTTP://127.0.0.1:0" + otherPort + "/",
		"http://localhost:" + otherPort, "localhost:" + otherPort} {
		resp := tr.post(t, "/add_worker?url="+url.QueryEscape(spelling), "")
		body := readAll(t, resp)
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal([]byte(body), &e)
		want, code := http.StatusConflict, "worker_exists"
		if !strings.Contains(spelling, "://") {
			want, code = http.StatusBadRequest, "invalid_worker_url" // a URL needs its scheme
		}
		if resp.StatusCode != want || e.Error.Code != code {
			t.Errorf("add %s: %d %s; want %d %s", spelling, resp.StatusCode, body, want, code)
		}
	}
	if urls := tr.Pool().URLs(); len(urls) != 2 {
		t.Fatalf("workers %v, want 2", urls)
	}
}

// Pod discovery spells its workers as the other ways in do: a pod whose IP is written as an
// IPv4-mapped IPv6 address and a pod of the same address in IPv4 are one worker.
func TestPodsOfOneAddressUnderTwoSpellingsAreOneWorker(t *testing.T) {
	port, pods := startPods(t, 120, 1)
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	c.create(t, newPod("vllm-0-mapped", "::ffff:"+pods[0].ip, true))
	tr, _ := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	testkit.WaitFor(t, "the pod to join", func() bool { return tr.available(pods[0].url) })
	if urls := tr.Pool().URLs(); !slices.Equal(urls, []string{pods[0].url}) {
		t.Fatalf("workers %v, want one: %s", urls, pods[0].url)
	}
}
