package router

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/discovery"
	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/routerapi"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// listedWorkers is GET /workers.
func listedWorkers(t *testing.T, tr *testRouter) []routerapi.WorkerInfo {
	t.Helper()
	status, body := adminCall(t, tr, http.MethodGet, "/workers", "")
	if status != http.StatusOK {
		t.Fatalf("GET /workers: %d %s", status, body)
	}
	var page struct {
		Workers []routerapi.WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	return page.Workers
}

// listed is the worker list's entry for base URL u.
func listed(t *testing.T, tr *testRouter, u string) routerapi.WorkerInfo {
	t.Helper()
	for _, w := range listedWorkers(t, tr) {
		if w.URL == u {
			return w
		}
	}
	t.Fatalf("%s is not listed", u)
	return routerapi.WorkerInfo{}
}

// unusedPort is a loopback port that no publisher binds, for a template that turns the
// subscriptions on without feeding them.
func unusedPort(t *testing.T) string {
	return strings.TrimPrefix(kvtest.FreeEndpoint(t), "tcp://127.0.0.1:")
}

// Two workers on one host; the template's port has no publisher, and the second worker's engine
// publishes on a port of its own, with a replay socket, both named when it is added through the
// admin API. Its stream is subscribed to there, its index fills, the worker list shows where, and
// a request for its prompt follows the events to it.
func TestWorkerAddedThroughTheAdminAPIIsSubscribedAtItsOwnEndpoint(t *testing.T) {
	pub := kvtest.New(t, "", true)
	a, b := newTokenizingWorker(t, "127.0.0.1"), newTokenizingWorker(t, "127.0.0.1")
	prompt := strings.Repeat("the repository's build notes, long enough for many blocks. ", 20)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.KVEventsEndpoint = "tcp://{host}:" + unusedPort(t)
	tr := startRouter(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	if status, body := adminCall(t, tr, http.MethodPost, "/add_worker?url="+url.QueryEscape(a.url), ""); status != http.StatusOK {
		t.Fatalf("add_worker: %d %s", status, body)
	}
	own := `{"url":"` + b.url + `","kv_events_endpoint":"` + pub.Endpoint + `","kv_events_replay_endpoint":"` + pub.Replay + `"}`
	if status, body := adminCall(t, tr, http.MethodPost, "/workers", own, "Content-Type", "application/json"); status != http.StatusOK {
		t.Fatalf("POST /workers with its own endpoint: %d %s", status, body)
	}
	testkit.WaitFor(t, "the second worker's blocks in the index", func() bool {
		pub.Send(storedBlocks(t, promptTokensOf(prompt), 40), false) // until the subscription has joined
		ev := listed(t, tr, b.url).KVEvents
		return ev != nil && ev.Blocks >= 40
	})
	if ev := listed(t, tr, b.url).KVEvents; ev.Endpoint != pub.Endpoint || ev.Replay != pub.Replay {
		t.Fatalf("the worker list shows %+v, want its own endpoints %s and %s", ev, pub.Endpoint, pub.Replay)
	}
	if ev := listed(t, tr, a.url).KVEvents; ev == nil || ev.Endpoint != "tcp://127.0.0.1:"+strings.TrimPrefix(cfg.KVEventsEndpoint, "tcp://{host}:") || ev.Blocks != 0 {
		t.Fatalf("the worker without its own endpoint is listed with %+v, want the template's, empty", ev)
	}
	resp := tr.post(t, "/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"`+prompt+`"}]}`)
	readAll(t, resp)
	if worker, decision := resp.Header.Get(proxy.HeaderBaseWorker), resp.Header.Get(proxy.HeaderDecision); worker != b.url || decision != "kv_events_match" {
		t.Fatalf("%s on %s, want kv_events_match on %s", decision, worker, b.url)
	}
}

// An endpoint that cannot be dialled is refused with 400 in the admin API's error shape, by both
// forms of the request, and the worker is not added; a router that subscribes to no events
// refuses any.
func TestAdminAPIRefusesAnUnusableEventEndpointAndAddsNothing(t *testing.T) {
	w := newFakeWorker(t)
	on := testConfig()
	on.KVEventsEndpoint = "tcp://{host}:5557"
	for _, c := range []struct {
		name       string
		cfg        func() config.Config
		path, body string
		code, why  string
	}{
		{"wildcard", func() config.Config { return on }, "/add_worker?url=" + url.QueryEscape(w.URL()) + "&kv_events_endpoint=" + url.QueryEscape("tcp://*:5557"), "", "invalid_kv_events_endpoint", "wildcard"},
		{"not tcp", func() config.Config { return on }, "/workers", `{"url":"` + w.URL() + `","kv_events_endpoint":"http://{host}:5557"}`, "invalid_kv_events_endpoint", "tcp://HOST:PORT"},
		{"replay alone", func() config.Config { return on }, "/workers", `{"url":"` + w.URL() + `","kv_events_replay_endpoint":"tcp://{host}:5558"}`, "invalid_kv_events_endpoint", "needs an events endpoint"},
		{"too long", func() config.Config { return on }, "/add_worker?url=" + url.QueryEscape(w.URL()) + "&kv_events_endpoint=tcp://" + strings.Repeat("h", 300) + ":5557", "", "invalid_kv_events_endpoint", "longer than"},
		{"events off", testConfig, "/add_worker?url=" + url.QueryEscape(w.URL()) + "&kv_events_endpoint=" + url.QueryEscape("tcp://{host}:5557"), "", "kv_events_off", "--kv-events-endpoint"},
	} {
		tr := startRouter(t, c.cfg())
		status, body := adminCall(t, tr, http.MethodPost, c.path, c.body, "Content-Type", "application/json")
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || status != http.StatusBadRequest || e.Error.Code != c.code ||
			e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, c.why) {
			t.Errorf("%s: %d %s, want 400 %s saying %q", c.name, status, body, c.code, c.why)
		}
		if tr.registered(w.URL()) {
			t.Errorf("%s: the worker was added though refused", c.name)
		}
	}
}

// A worker's own endpoint is dialled only once its host passes --worker-url-allow, as the
// template's is: the worker on 127.0.0.2 (allowed) naming an endpoint on 127.0.0.1 (not) is not
// subscribed to; naming one on its own host, it is.
func TestWorkersOwnEndpointOutsideTheAllowListIsNotDialled(t *testing.T) {
	w := newTokenizingWorker(t, "127.0.0.2")
	u, err := tenant.ParseURL(w.url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		endpoint, want string
	}{{"tcp://127.0.0.1:6001", ""}, {"tcp://{host}:6001", "tcp://127.0.0.2:6001"}} {
		cfg := testConfig()
		cfg.KVEventsEndpoint = "tcp://{host}:5557"
		cfg.WorkerURLAllow = []string{"127.0.0.2/32"}
		tr := startRouter(t, cfg)
		if _, err := tr.Join(t.Context(), fleet.Admin, u, workers.RoleColocated, kvevents.WorkerEndpoints{Events: c.endpoint}); err != nil {
			t.Fatal(err)
		}
		srcs := tr.kvSources(t.Context(), map[tenant.ID]resolvedEndpoints{})
		if c.want == "" && len(srcs) != 0 {
			t.Fatalf("%s, outside the list: subscribed %+v", c.endpoint, srcs)
		}
		if c.want != "" && (len(srcs) != 1 || srcs[0].Endpoint != c.want) {
			t.Fatalf("%s: %+v, want one subscription at %s", c.endpoint, srcs, c.want)
		}
	}
}

// A pod annotated with its engine's endpoint is subscribed to there rather than at the template;
// when the annotation changes, the subscription follows; an annotation that cannot be used leaves
// the worker in the fleet, at the template's endpoint.
func TestAnnotatedPodIsSubscribedAtItsEndpointAndFollowsItsChanges(t *testing.T) {
	pub1, pub2 := kvtest.New(t, "", false), kvtest.New(t, "", false)
	w := newTokenizingWorker(t, "127.0.0.1")
	port, err := strconv.Atoi(w.url[strings.LastIndex(w.url, ":")+1:])
	if err != nil {
		t.Fatal(err)
	}
	c := newFakeCluster(t)
	template := "tcp://{host}:" + unusedPort(t)
	cfg := discoveryConfig("cache_aware", port)
	cfg.KVEventsEndpoint = template
	portOf := func(ep string) string { return ep[strings.LastIndex(ep, ":")+1:] }
	pod := newPod("vllm-0", "127.0.0.1", true)
	pod.Metadata.Annotations = map[string]string{discovery.AnnotationKVEventsEndpoint: "tcp://{host}:" + portOf(pub1.Endpoint)}
	c.create(t, pod)
	tr, _ := startDiscovering(t, cfg, c.env())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	subscribed := func(pub *kvtest.Publisher) {
		t.Helper()
		h := 0
		testkit.WaitFor(t, "blocks from "+pub.Endpoint, func() bool {
			h++
			pub.Send(storedBatch(t, h), false) // until the subscription has joined
			st := tr.kvEvents.Status()
			return len(st) == 1 && st[0].Endpoint == pub.Endpoint && st[0].Blocks >= 1
		})
	}
	subscribed(pub1)
	pod.Metadata.Annotations[discovery.AnnotationKVEventsEndpoint] = pub2.Endpoint
	c.updateStatus(t, pod)
	subscribed(pub2)
	pod.Metadata.Annotations[discovery.AnnotationKVEventsEndpoint] = "tcp://*:5557"
	c.updateStatus(t, pod)
	testkit.WaitFor(t, "the subscription back at the template", func() bool {
		st := tr.kvEvents.Status()
		return len(st) == 1 && st[0].Endpoint == "tcp://127.0.0.1:"+portOf(template) && tr.available(w.url)
	})
}
