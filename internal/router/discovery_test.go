package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/discovery"
	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/kubeapi/kubetest"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// podWorker is a worker listening on its own loopback address (127.0.0.x), on the port every
// pod of a test shares, as vLLM pods do on their pod IPs.
type podWorker struct {
	ip, url  string
	hits     atomic.Int64
	firstHit atomic.Int64 // UnixNano of the first routed request
	healthy  atomic.Bool

	mu      sync.Mutex
	hold    chan struct{} // when set, routed requests wait until it is closed
	entered chan struct{} // a tick per routed request that started waiting on hold
}

func (p *podWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !p.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		return
	case "/v1/models":
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"test-model","object":"model"}]}`)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if p.hits.Add(1) == 1 {
		p.firstHit.Store(time.Now().UnixNano())
	}
	p.mu.Lock()
	hold, entered := p.hold, p.entered
	p.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"from %s"},"finish_reason":"stop"}]}`, p.ip)
}

// holdRequests makes routed requests wait until the returned function is called.
func (p *podWorker) holdRequests() (entered <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold, p.entered = make(chan struct{}), make(chan struct{}, 16)
	hold := p.hold
	return p.entered, func() { close(hold) }
}

// startPods starts n workers on 127.0.0.base … 127.0.0.base+n-1, all on one port, and returns
// the port.
func startPods(t *testing.T, base, n int) (int, []*podWorker) {
	t.Helper()
	for range 20 {
		first, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", base))
		if err != nil {
			t.Fatal(err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{first}
		for i := 1; i < n; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", base+i, port))
			if err != nil {
				break // the port is taken on that address: try another
			}
			lns = append(lns, ln)
		}
		if len(lns) < n {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		var pods []*podWorker
		for i, ln := range lns {
			p := &podWorker{ip: fmt.Sprintf("127.0.0.%d", base+i)}
			p.url = "http://" + net.JoinHostPort(p.ip, strconv.Itoa(port))
			p.healthy.Store(true)
			srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			pods = append(pods, p)
		}
		return port, pods
	}
	t.Fatal("no port free on every address")
	return 0, nil
}

// fakeCluster is an in-process API server holding the pods of namespace "llm" (and others).
type fakeCluster struct {
	*kubetest.Server
	t *testing.T
}

func newFakeCluster(t *testing.T) *fakeCluster { return &fakeCluster{Server: kubetest.New(t), t: t} }

func (c *fakeCluster) env() discoveryEnv {
	client := c.Client(c.t)
	return discoveryEnv{
		kubeClient: func(string) (*kubeapi.Client, error) { return client, nil },
		namespace:  func() string { return "llm" },
	}
}

func newPod(name, ip string, ready bool, labels ...string) *kubeapi.Pod {
	if len(labels) == 0 {
		labels = []string{"app", "vllm"}
	}
	p := kubetest.Pod("llm", name, ip, ready, labels...)
	return &p
}

func markReady(p *kubeapi.Pod, ready bool) { kubetest.SetReady(p, ready) }

func (c *fakeCluster) create(_ *testing.T, p *kubeapi.Pod) { c.Create(*p) }

func (c *fakeCluster) updateStatus(_ *testing.T, p *kubeapi.Pod) { c.Update(*p) }

func (c *fakeCluster) delete(t *testing.T, name string) {
	t.Helper()
	if !c.Delete("llm", name) {
		t.Fatalf("no pod %s to delete", name)
	}
}

// discoveryConfig watches pods labelled app=vllm on port.
func discoveryConfig(policy string, port int) config.Config {
	cfg := testConfig()
	cfg.Policy = policy
	cfg.ServiceDiscovery = true
	cfg.Selector = []string{"app=vllm"}
	cfg.ServiceDiscoveryPort = port
	return cfg
}

// startDiscovering serves a router built from cfg whose discovery sources come from env. The API
// server replays to a watch what changed since the list it follows, so a change made before the
// watch is open is not missed.
func startDiscovering(t *testing.T, cfg config.Config, env discoveryEnv) (*testRouter, *reconciler) {
	t.Helper()
	tr := startRouter(t, withoutDiscovery(cfg))
	sources, err := newSources(cfg, tr.log, env)
	if err != nil {
		t.Fatal(err)
	}
	return tr, tr.startDiscovery(t.Context(), sources...)
}

// withoutDiscovery is cfg for New, which would build the sources for the real cluster and DNS;
// the tests build theirs with newSources.
func withoutDiscovery(cfg config.Config) config.Config {
	cfg.ServiceDiscovery, cfg.Selector, cfg.PrefillSelector, cfg.DecodeSelector, cfg.DNSDiscovery = false, nil, nil, nil, ""
	return cfg
}

func (tr *testRouter) available(url string) bool {
	ws := tr.Pool().Get(url)
	return len(ws) > 0 && ws[0].Available()
}

func (tr *testRouter) registered(url string) bool { return len(tr.Pool().Get(url)) > 0 }

var chatClient = &http.Client{Timeout: 10 * time.Second}

// chat sends one chat turn and returns the serving worker's base URL and the decision label.
func (tr *testRouter) chat(t *testing.T, session, text string) (worker, decision string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "test-model", "messages": []map[string]string{{"role": "user", "content": text}}})
	req, _ := http.NewRequest(http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("x-session-id", session)
	}
	resp, err := chatClient.Do(req)
	if err != nil {
		t.Fatal(err) // a request held by a worker that should have had none ends here
	}
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header.Get(proxy.HeaderBaseWorker), resp.Header.Get(proxy.HeaderDecision)
}

// routesTo sends a session-less chat turn and fails the test unless it reached worker (a base
// URL): how a discovery test sees that the pods it left in the pool are the ones in use. when
// names the moment in the failure.
func (tr *testRouter) routesTo(t *testing.T, worker, when string) {
	t.Helper()
	if w, _ := tr.chat(t, "", "hi"); w != worker {
		t.Fatalf("%s: a request went to %s, want %s", when, w, worker)
	}
}

// reached sends n session-less chat turns and returns the set of workers (base URLs) they
// reached.
func (tr *testRouter) reached(t *testing.T, n int) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		w, _ := tr.chat(t, "", "hi")
		seen[w] = true
	}
	return seen
}

// The time from a pod turning Ready to the first request routed to it, measured while a client
// sends requests back to back. Target: at most 1 s; asserted only against a generous bound.
func TestReadyPodJoinsAndIsRoutedToSoon(t *testing.T) {
	port, pods := startPods(t, 10, 6)
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	for i, p := range pods[1:] {
		c.create(t, newPod(fmt.Sprintf("vllm-%d", i+1), p.ip, false))
	}
	tr, _ := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	testkit.WaitFor(t, "vllm-0 to join", func() bool { return tr.available(pods[0].url) })
	for _, p := range pods[1:] {
		if tr.registered(p.url) {
			t.Fatalf("%s joined before it was Ready", p.url)
		}
	}

	ctx, stop := context.WithCancel(context.Background())
	var failures atomic.Int64
	loadDone := make(chan struct{})
	go func() { // a client sending requests back to back
		defer close(loadDone)
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(chatBody))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					failures.Add(1)
				}
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failures.Add(1)
			}
		}
	}()
	defer func() { stop(); <-loadDone }()

	var took []time.Duration
	for i, p := range pods[1:] {
		if p.hits.Load() != 0 {
			t.Fatalf("%s was routed to while not Ready", p.url)
		}
		pod := newPod(fmt.Sprintf("vllm-%d", i+1), p.ip, true)
		start := time.Now()
		c.updateStatus(t, pod)
		if !testkit.Poll(testkit.Patience, 100*time.Microsecond, func() bool { return p.firstHit.Load() != 0 }) {
			t.Fatalf("%s got no request within 10 s of turning Ready", p.url)
		}
		took = append(took, time.Unix(0, p.firstHit.Load()).Sub(start))
	}
	slices.Sort(took)
	t.Logf("pod Ready -> first routed request, %d joins: min %v, median %v, max %v (target <= 1s)", len(took), took[0], took[len(took)/2], took[len(took)-1])
	if f := failures.Load(); f != 0 {
		t.Fatalf("%d requests failed while pods joined", f)
	}
}

func TestNotReadyPodDrainsAtOnceAndReturnsWhenReady(t *testing.T) {
	port, pods := startPods(t, 20, 2)
	c := newFakeCluster(t)
	a, b := newPod("vllm-a", pods[0].ip, true), newPod("vllm-b", pods[1].ip, true)
	c.create(t, a)
	c.create(t, b)
	tr, rc := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	testkit.WaitFor(t, "both pods to join", func() bool { return tr.available(pods[0].url) && tr.available(pods[1].url) })

	markReady(a, false)
	c.updateStatus(t, a)
	testkit.WaitFor(t, "vllm-a to drain", func() bool { return tr.Pool().Get(pods[0].url)[0].Draining() })
	if !rc.Discovered()[pods[0].url] {
		t.Fatal("the reconciler does not count vllm-a as draining")
	}
	before := pods[0].hits.Load()
	for range 10 {
		tr.routesTo(t, pods[1].url, "while vllm-a drains")
	}
	if pods[0].hits.Load() != before || !tr.registered(pods[0].url) {
		t.Fatal("a draining pod got requests, or left the pool")
	}

	markReady(a, true)
	c.updateStatus(t, a)
	testkit.WaitFor(t, "vllm-a to take requests again", func() bool { return tr.available(pods[0].url) })
	if seen := tr.reached(t, 4); !seen[pods[0].url] {
		t.Fatalf("vllm-a took no request after it was Ready again: %v", seen)
	}
}

// A terminating pod takes no new request but finishes the one it has, even when it is deleted
// before that request ends.
func TestTerminatingPodFinishesInFlightRequestsAndTakesNoNewOnes(t *testing.T) {
	port, pods := startPods(t, 30, 2)
	c := newFakeCluster(t)
	a := newPod("vllm-a", pods[0].ip, true)
	c.create(t, a)
	tr, _ := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	testkit.WaitFor(t, "vllm-a to join", func() bool { return tr.available(pods[0].url) })

	entered, release := pods[0].holdRequests()
	type answer struct {
		status int
		body   string
	}
	inflight := make(chan answer, 1)
	go func() {
		resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			inflight <- answer{0, err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		inflight <- answer{resp.StatusCode, string(b)}
	}()
	select { // the request is on vllm-a
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach vllm-a")
	}

	c.create(t, newPod("vllm-b", pods[1].ip, true))
	testkit.WaitFor(t, "vllm-b to join", func() bool { return tr.available(pods[1].url) })
	kubetest.Terminate(a) // kubectl delete: the pod terminates, still Ready for a while
	c.updateStatus(t, a)
	testkit.WaitFor(t, "vllm-a to drain", func() bool { return tr.Pool().Get(pods[0].url)[0].Draining() })
	for range 8 {
		tr.routesTo(t, pods[1].url, "while vllm-a terminates")
	}
	if got := pods[0].hits.Load(); got != 1 {
		t.Fatalf("terminating vllm-a got %d requests, want only the one in flight", got)
	}

	c.delete(t, "vllm-a") // the pod object goes while its request is still running
	testkit.WaitFor(t, "vllm-a to leave", func() bool { return !tr.registered(pods[0].url) })
	release()
	select {
	case got := <-inflight:
		if got.status != http.StatusOK || !strings.Contains(got.body, "from "+pods[0].ip) {
			t.Fatalf("in-flight request: %d %s", got.status, got.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the in-flight request did not finish")
	}
	testkit.WaitFor(t, "load back to zero", func() bool { return tr.totalLoad() == 0 })
}

// A deleted pod leaves: its sessions and its prefix tree entries go with it, so each of its
// sessions re-places through the chain at its next turn (never pointed at the gone worker, nor
// "stale" because the tree still names it) while every session on the other 7 keeps its worker.
func TestRemovingOneOfEightWorkersReplacesOnlyItsSessions(t *testing.T) {
	port, pods := startPods(t, 40, 8)
	c := newFakeCluster(t)
	for i, p := range pods {
		c.create(t, newPod(fmt.Sprintf("vllm-%d", i), p.ip, true))
	}
	tr, _ := startDiscovering(t, discoveryConfig("cache_aware", port), c.env())
	testkit.WaitFor(t, "8 workers", func() bool {
		for _, p := range pods {
			if !tr.available(p.url) {
				return false
			}
		}
		return true
	})
	const sessions = 64
	home := map[string]string{}
	text := func(s string) string {
		return fmt.Sprintf("Session %s: a long conversation about refactoring module %s without breaking its tests.", s, s)
	}
	for i := range sessions {
		s := fmt.Sprintf("agent-%d", i)
		home[s], _ = tr.chat(t, s, text(s))
		if w, d := tr.chat(t, s, text(s)); w != home[s] || d != cacheaware.LabelSessionMatch {
			t.Fatalf("%s turn 2: %s on %s, want session_id_match on %s", s, d, w, home[s])
		}
	}
	perWorker := map[string]int{}
	for _, w := range home {
		perWorker[w]++
	}
	gone := pods[0]
	for _, p := range pods { // remove the worker holding the most sessions
		if perWorker[p.url] > perWorker[gone.url] {
			gone = p
		}
	}
	if perWorker[gone.url] == 0 {
		t.Fatalf("no session landed anywhere: %v", perWorker)
	}
	pol := tr.policy.(*cacheaware.Policy)
	chars := pol.TreeChars()
	c.delete(t, "vllm-"+strconv.Itoa(slices.Index(pods, gone)))
	testkit.WaitFor(t, "the worker to leave", func() bool { return !tr.registered(gone.url) })
	if after := pol.TreeChars(); after >= chars {
		t.Fatalf("the prefix tree kept %d of %d bytes of text after the removal", after, chars)
	}

	moved := 0
	for s, h := range home {
		w, d := tr.chat(t, s, text(s))
		if h != gone.url {
			if w != h || d != cacheaware.LabelSessionMatch {
				t.Errorf("%s was on %s (still there) and went to %s by %s", s, h, w, d)
			}
			continue
		}
		moved++
		if w == gone.url || d == cacheaware.LabelSessionMatch || d == cacheaware.LabelStaleTenant {
			t.Errorf("%s of the removed worker: %s on %s", s, d, w)
		}
		if w2, d2 := tr.chat(t, s, text(s)); w2 != w || d2 != cacheaware.LabelSessionMatch {
			t.Errorf("%s after re-placing on %s: %s on %s", s, w, d2, w2)
		}
	}
	t.Logf("removed 1 of 8 workers: %d of %d sessions re-placed, %d kept their worker", moved, sessions, sessions-moved)
	if moved != perWorker[gone.url] {
		t.Fatalf("%d sessions moved, the removed worker had %d", moved, perWorker[gone.url])
	}
}

// A pod whose address changes (recreated under its name) leaves at the old address and joins at
// the new one.
func TestPodAddressChangeIsALeaveAndAJoin(t *testing.T) {
	port, pods := startPods(t, 50, 2)
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	tr, _ := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	testkit.WaitFor(t, "the first address", func() bool { return tr.available(pods[0].url) })
	c.delete(t, "vllm-0")
	c.create(t, newPod("vllm-0", pods[1].ip, true))
	testkit.WaitFor(t, "only the new address", func() bool { return !tr.registered(pods[0].url) && tr.available(pods[1].url) })
	tr.routesTo(t, pods[1].url, "after the address change")
}

func TestDataParallelRanksApplyPerDiscoveredPod(t *testing.T) {
	port, pods := startPods(t, 60, 1)
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	cfg := discoveryConfig("round_robin", port)
	cfg.DPSize = 2
	tr, _ := startDiscovering(t, cfg, c.env())
	testkit.WaitFor(t, "the pod to join", func() bool { return tr.available(pods[0].url) })
	var tenants []string
	for _, w := range tr.Pool().Get(pods[0].url) {
		tenants = append(tenants, string(w.ID()))
	}
	if !slices.Equal(tenants, []string{pods[0].url + "@0", pods[0].url + "@1"}) {
		t.Fatalf("tenants %v", tenants)
	}
	c.delete(t, "vllm-0")
	testkit.WaitFor(t, "both ranks to leave", func() bool { return len(tr.Pool().All()) == 0 })
}

// Static workers and discovered ones mix; discovery never drains or removes a static worker,
// even one it also finds.
func TestStaticWorkersAreNeverRemovedByDiscovery(t *testing.T) {
	static := newFakeWorker(t)
	host, portStr, _ := net.SplitHostPort(strings.TrimPrefix(static.URL(), "http://"))
	port, _ := strconv.Atoi(portStr)
	c := newFakeCluster(t)
	shadow := newPod("shadow", host, true) // a pod at the static worker's address
	c.create(t, shadow)
	c.create(t, newPod("other", "127.0.0.99", true)) // nobody listens there: joins unhealthy
	cfg := discoveryConfig("round_robin", port)
	cfg.WorkerURLs = []string{static.URL()}
	tr := startRouter(t, withoutDiscovery(cfg), static)
	sources, err := newSources(cfg, tr.log, c.env())
	if err != nil {
		t.Fatal(err)
	}
	applied := &appliedSets{Source: sources[0], changed: make(chan struct{}, 1)}
	tr.startDiscovery(t.Context(), applied)
	other := "http://" + net.JoinHostPort("127.0.0.99", portStr)
	testkit.WaitFor(t, "the other pod to be registered", func() bool { return tr.registered(other) })

	markReady(shadow, false)
	c.updateStatus(t, shadow)
	c.delete(t, "other")
	testkit.WaitFor(t, "the other pod to leave", func() bool { return !tr.registered(other) })
	if !tr.available(static.URL()) {
		t.Fatal("discovery drained the static worker")
	}
	c.delete(t, "shadow")
	applied.waitEmpty(t) // the router has applied a set without any pod
	if !tr.available(static.URL()) || len(tr.Pool().URLs()) != 1 {
		t.Fatalf("after every pod left: %v, static available %v", tr.Pool().URLs(), tr.available(static.URL()))
	}
}

// appliedSets runs a source and tells when the router has applied an empty set from it.
type appliedSets struct {
	discovery.Source
	mu      sync.Mutex
	empty   bool
	changed chan struct{}
}

func (a *appliedSets) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	return a.Source.Run(ctx, func(set []discovery.Endpoint) {
		update(set) // the reconciler has applied set once this returns
		a.mu.Lock()
		a.empty = len(set) == 0
		a.mu.Unlock()
		select {
		case a.changed <- struct{}{}:
		default:
		}
	})
}

func (a *appliedSets) waitEmpty(t *testing.T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		a.mu.Lock()
		empty := a.empty
		a.mu.Unlock()
		if empty {
			return
		}
		select {
		case <-a.changed:
		case <-deadline:
			t.Fatal("no empty set was applied")
		}
	}
}

// Two routers watching the same pods end with the same workers in the same states.
func TestRoutersWatchingTheSameClusterConverge(t *testing.T) {
	port, pods := startPods(t, 70, 4)
	c := newFakeCluster(t)
	cfg := discoveryConfig("cache_aware", port)
	r1, _ := startDiscovering(t, cfg, c.env())
	r2, _ := startDiscovering(t, cfg, c.env())
	p := make([]*kubeapi.Pod, len(pods))
	for i, w := range pods {
		p[i] = newPod(fmt.Sprintf("vllm-%d", i), w.ip, i != 3)
		c.create(t, p[i])
	}
	testkit.WaitFor(t, "three ready pods to join both routers", func() bool {
		for _, tr := range []*testRouter{r1, r2} {
			if !tr.available(pods[0].url) || !tr.available(pods[1].url) || !tr.available(pods[2].url) {
				return false
			}
		}
		return true
	})
	markReady(p[1], false)
	c.updateStatus(t, p[1])
	c.delete(t, "vllm-2")
	markReady(p[3], true)
	c.updateStatus(t, p[3])

	// vllm-0 and vllm-3 available, vllm-1 draining, vllm-2 gone.
	state := func(tr *testRouter) string {
		var out []string
		for _, w := range tr.Pool().All() {
			out = append(out, fmt.Sprintf("%s healthy=%v draining=%v", w.URL(), w.Healthy(), w.Draining()))
		}
		sort.Strings(out)
		return strings.Join(out, "; ")
	}
	want := fmt.Sprintf("%s healthy=true draining=false; %s healthy=true draining=true; %s healthy=true draining=false",
		pods[0].url, pods[1].url, pods[3].url)
	testkit.WaitFor(t, "both routers to reach the cluster's state", func() bool { return state(r1) == want && state(r2) == want })
}

func TestDNSDiscoveredWorkersJoinAndLeave(t *testing.T) {
	port, pods := startPods(t, 80, 2)
	var mu sync.Mutex
	addrs := []string{pods[0].ip, pods[1].ip}
	lookup := func(_ context.Context, name string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		if name != "vllm.llm.svc" {
			return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
		}
		var out []netip.Addr
		for _, a := range addrs {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
	cfg := testConfig()
	cfg.DNSDiscovery = "vllm.llm.svc:" + strconv.Itoa(port)
	cfg.DNSRefreshSecs = 0.01
	tr, _ := startDiscovering(t, cfg, discoveryEnv{lookup: lookup})
	testkit.WaitFor(t, "both addresses to join", func() bool { return tr.available(pods[0].url) && tr.available(pods[1].url) })
	if seen := tr.reached(t, 4); len(seen) != 2 {
		t.Fatalf("requests reached %v", seen)
	}
	mu.Lock()
	addrs = addrs[1:]
	mu.Unlock()
	testkit.WaitFor(t, "the first address to leave", func() bool { return !tr.registered(pods[0].url) })
	tr.routesTo(t, pods[1].url, "after the first address left")
}

// With the namespace flag empty the router's own namespace is watched; with it set, that one.
func TestServiceDiscoveryWatchesTheNamespaceItIsGiven(t *testing.T) {
	port, pods := startPods(t, 90, 2)
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	elsewhere := newPod("vllm-x", pods[1].ip, true)
	elsewhere.Metadata.Namespace = "team-b"
	c.create(t, elsewhere)

	own, _ := startDiscovering(t, discoveryConfig("round_robin", port), c.env())
	cfg := discoveryConfig("round_robin", port)
	cfg.ServiceDiscoveryNamespace = "team-b"
	named, _ := startDiscovering(t, cfg, c.env())
	testkit.WaitFor(t, "each router's pod", func() bool { return own.available(pods[0].url) && named.available(pods[1].url) })
	if own.registered(pods[1].url) || named.registered(pods[0].url) {
		t.Fatalf("a router found a pod of another namespace: %v / %v", own.Pool().URLs(), named.Pool().URLs())
	}
}

func TestServiceDiscoveryOutsideAClusterFailsAtStart(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	cfg := discoveryConfig("round_robin", 8000)
	_, err := New(cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--service-discovery") || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("New outside a cluster: %v", err)
	}
	cfg.Kubeconfig = "/nonexistent/kubeconfig"
	if _, err := New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--service-discovery") {
		t.Fatalf("New with a missing kubeconfig: %v", err)
	}
}

// A source whose Run fails is run again; its sets still apply.
func TestFailedSourceIsRunAgain(t *testing.T) {
	defer func(d time.Duration) { sourceRestartDelay = d }(sourceRestartDelay)
	sourceRestartDelay = 10 * time.Millisecond
	_, pods := startPods(t, 100, 1)
	tr := startRouter(t, testConfig())
	src := &flakySource{set: []discovery.Endpoint{{URL: pods[0].url, Ready: true}}}
	tr.startDiscovery(t.Context(), src)
	testkit.WaitFor(t, "the worker from the second run", func() bool { return tr.available(pods[0].url) })
	if src.runs.Load() < 2 {
		t.Fatalf("%d runs", src.runs.Load())
	}
}

type flakySource struct {
	runs atomic.Int64
	set  []discovery.Endpoint
}

func (f *flakySource) Name() string { return "flaky" }

func (f *flakySource) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	if f.runs.Add(1) == 1 {
		return errors.New("cannot watch")
	}
	update(f.set)
	<-ctx.Done()
	return ctx.Err()
}
