package router

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

func (tr *testRouter) role(t *testing.T, raw string) workers.Role {
	t.Helper()
	ws := tr.Pool().Get(raw)
	if len(ws) == 0 {
		t.Fatalf("%s is not registered", raw)
	}
	return ws[0].Role()
}

func (tr *testRouter) holders(t *testing.T, raw string) []fleet.Source {
	t.Helper()
	u, err := tenant.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tr.fleet.Holders(u)
}

// --worker-urls, --prefill and --decode workers join at Start in their roles, probed, held by the
// static list.
func TestStaticWorkersJoinInTheirRoles(t *testing.T) {
	colocated, prefill, decode := newFakeWorker(t), newFakeWorker(t), newFakeWorker(t)
	cfg := testConfig()
	cfg.WorkerURLs = []string{colocated.URL()}
	cfg.Prefill = []string{prefill.URL() + "/"}
	cfg.Decode = []string{decode.URL()}
	tr := startRouter(t, cfg)
	tr.Start(t.Context())
	for w, want := range map[*fakeWorker]workers.Role{colocated: workers.RoleColocated, prefill: workers.RolePrefill, decode: workers.RoleDecode} {
		if got := tr.role(t, w.URL()); got != want {
			t.Errorf("%s joined as %s, want %s", w.URL(), got, want)
		}
		if !tr.available(w.URL()) {
			t.Errorf("%s was not probed at Start", w.URL())
		}
		if got := tr.holders(t, w.URL()); !slices.Equal(got, []fleet.Source{fleet.Static}) {
			t.Errorf("%s held by %v", w.URL(), got)
		}
	}
}

type workerList struct {
	Workers []struct {
		URL  string `json:"url"`
		Role string `json:"role"`
	} `json:"workers"`
}

// The admin API joins a worker in the role it is given (JSON body or query), shows it in the
// worker list, and refuses an unknown role and a second role for one worker in its error shape.
func TestAdminAPIJoinsInTheGivenRole(t *testing.T) {
	prefill, decode := newFakeWorker(t), newFakeWorker(t)
	tr := startRouter(t, testConfig())

	resp := tr.post(t, "/workers", `{"url":"`+prefill.URL()+`","role":"prefill"}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /workers: %d %s", resp.StatusCode, body)
	}
	resp = tr.post(t, "/add_worker?url="+url.QueryEscape(decode.URL())+"&role=decode", "")
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /add_worker: %d %s", resp.StatusCode, body)
	}
	if !tr.available(prefill.URL()) || !tr.available(decode.URL()) {
		t.Fatal("the admin API answered before the first probe")
	}
	got, err := http.Get(tr.url + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	var list workerList
	if err := json.Unmarshal([]byte(readAll(t, got)), &list); err != nil {
		t.Fatal(err)
	}
	roles := map[string]string{}
	for _, w := range list.Workers {
		roles[w.URL] = w.Role
	}
	if roles[prefill.URL()] != "prefill" || roles[decode.URL()] != "decode" {
		t.Fatalf("GET /workers roles %v", roles)
	}

	for _, tt := range []struct {
		body, code string
		status     int
	}{
		{`{"url":"` + newFakeWorker(t).URL() + `","role":"gpu"}`, "invalid_worker_role", http.StatusBadRequest},
		{`{"url":"` + prefill.URL() + `","role":"decode"}`, "worker_role_conflict", http.StatusConflict},
		{`{"url":"` + prefill.URL() + `","role":"prefill"}`, "worker_exists", http.StatusConflict},
	} {
		resp := tr.post(t, "/workers", tt.body)
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		body := readAll(t, resp)
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != tt.status || e.Error.Code != tt.code {
			t.Errorf("POST /workers %s: %d %s; want %d %s", tt.body, resp.StatusCode, body, tt.status, tt.code)
		}
	}
	if tr.role(t, prefill.URL()) != workers.RolePrefill || len(tr.Pool().URLs()) != 2 {
		t.Fatalf("after the refused joins: %v, prefill worker is %s", tr.Pool().URLs(), tr.role(t, prefill.URL()))
	}
}

// Pods matched by --prefill-selector and --decode-selector join in those roles, each role's
// watch on its own.
func TestPodsOfEachRoleSelectorJoinInThatRole(t *testing.T) {
	port, pods := startPods(t, 1, 2)
	c := newFakeCluster(t)
	c.create(t, newPod("prefill-0", pods[0].ip, true, "app", "vllm", "role", "prefill"))
	c.create(t, newPod("decode-0", pods[1].ip, true, "app", "vllm", "role", "decode"))
	cfg := discoveryConfig("round_robin", port)
	cfg.Selector = nil
	cfg.PrefillSelector = []string{"app=vllm", "role=prefill"}
	cfg.DecodeSelector = []string{"app=vllm", "role=decode"}
	tr, _ := startDiscovering(t, cfg, c.env())
	testkit.WaitFor(t, "both pods to join", func() bool { return tr.available(pods[0].url) && tr.available(pods[1].url) })
	if tr.role(t, pods[0].url) != workers.RolePrefill || tr.role(t, pods[1].url) != workers.RoleDecode {
		t.Fatalf("roles %s, %s; want prefill, decode", tr.role(t, pods[0].url), tr.role(t, pods[1].url))
	}
	if got := tr.holders(t, pods[0].url); !slices.Equal(got, []fleet.Source{"kubernetes-prefill"}) {
		t.Fatalf("prefill pod held by %v", got)
	}
}

// A worker that a pod watch and a DNS name both report stays when DNS stops reporting it, and
// leaves when the pod goes too.
func TestWorkerFoundByTwoSourcesStaysUntilBothStop(t *testing.T) {
	port, pods := startPods(t, 1, 1)
	var mu sync.Mutex
	addrs := []string{pods[0].ip}
	lookup := func(_ context.Context, name string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []netip.Addr
		for _, a := range addrs {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
	c := newFakeCluster(t)
	c.create(t, newPod("vllm-0", pods[0].ip, true))
	cfg := discoveryConfig("round_robin", port)
	cfg.DNSDiscovery = net.JoinHostPort("vllm.llm.svc", strconv.Itoa(port))
	cfg.DNSRefreshSecs = 0.01
	env := c.env()
	env.lookup = lookup
	tr := startRouter(t, withoutDiscovery(cfg))
	sources, err := newSources(cfg, tr.log, env)
	if err != nil || len(sources) != 2 || sources[1].Name() != "dns" {
		t.Fatalf("sources %v, %v", sources, err)
	}
	dns := &appliedSets{Source: sources[1], changed: make(chan struct{}, 1)}
	tr.startDiscovery(t.Context(), sources[0], dns)
	testkit.WaitFor(t, "both sources to hold the pod", func() bool {
		return slices.Equal(tr.holders(t, pods[0].url), []fleet.Source{"dns", "kubernetes"})
	})

	mu.Lock()
	addrs = nil
	mu.Unlock()
	dns.waitEmpty(t)
	if got := tr.holders(t, pods[0].url); !tr.available(pods[0].url) || !slices.Equal(got, []fleet.Source{"kubernetes"}) {
		t.Fatalf("after DNS let go: available %v, held by %v", tr.available(pods[0].url), got)
	}
	c.delete(t, "vllm-0")
	testkit.WaitFor(t, "the pod to leave", func() bool { return !tr.registered(pods[0].url) })
}
