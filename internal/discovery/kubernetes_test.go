package discovery

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/kubeapi/kubetest"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

var pod = kubetest.Pod

// newCluster is an in-process API server holding pods.
func newCluster(t *testing.T, pods ...kubeapi.Pod) *kubetest.Server {
	t.Helper()
	s := kubetest.New(t)
	for _, p := range pods {
		s.Create(p)
	}
	return s
}

// watchPods starts a source watching namespace "llm" for app=vllm on port 8000 through client,
// and waits for its first set.
func watchPods(t *testing.T, client *kubeapi.Client, log *slog.Logger) *recorder {
	t.Helper()
	src, err := NewKubernetes(KubernetesOptions{Client: client, Namespace: "llm", Selector: "app=vllm", Port: 8000, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	rec := runSource(t, src)
	rec.waitFor(t, "the first set", func([]Endpoint) bool { return true })
	return rec
}

func watch(t *testing.T, s *kubetest.Server) *recorder { return watchPods(t, s.Client(t), nil) }

// watchOpen waits until n watches have been opened on s.
func watchOpen(t *testing.T, s *kubetest.Server, n int) []kubetest.Request {
	t.Helper()
	return s.WaitFor(t, strconv.Itoa(n)+" watches", func(rs []kubetest.Request) bool { return kubetest.Watches(rs) >= n })
}

func lists(rs []kubetest.Request) int {
	n := 0
	for _, r := range rs {
		if !r.Watch {
			n++
		}
	}
	return n
}

func lastWatch(rs []kubetest.Request) kubetest.Request {
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i].Watch {
			return rs[i]
		}
	}
	return kubetest.Request{}
}

func TestKubernetesListsExistingPodsAtStart(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"), pod("llm", "vllm-0", "10.0.0.1", false, "app", "vllm"))
	rec := watch(t, s)
	rec.waitFor(t, "both pods", is("http://10.0.0.1:8000", false, "http://10.0.0.2:8000", true))
	set, _ := rec.last()
	if set[0].Name != "llm/vllm-0" || set[1].Name != "llm/vllm-1" {
		t.Fatalf("names %q %q", set[0].Name, set[1].Name)
	}
}

func TestKubernetesAddedReadyPodIsWantedReady(t *testing.T) {
	s := newCluster(t)
	rec := watch(t, s)
	if set, _ := rec.last(); len(set) != 0 {
		t.Fatalf("empty cluster reported %v", set)
	}
	s.Create(pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec.waitFor(t, "the new pod, ready", is("http://10.0.0.1:8000", true))
}

func TestKubernetesPodIsWantedOnceItHasAnIPAndReadyOnceItIsReady(t *testing.T) {
	s := newCluster(t)
	rec := watch(t, s)
	p := pod("llm", "vllm-0", "", false, "app", "vllm")
	s.Create(p)
	p.Status.PodIP = "10.0.0.1"
	s.Update(p)
	rec.waitFor(t, "the pod with its IP, not ready", is("http://10.0.0.1:8000", false))
	kubetest.SetReady(&p, true)
	s.Update(p)
	rec.waitFor(t, "the pod ready", is("http://10.0.0.1:8000", true))
}

// A ready pod that changes is reported after the change as the change says: draining (still
// wanted, not ready) when it turns not ready or starts terminating though still ready, gone when
// it is deleted or has finished.
func TestKubernetesReadyPodThatChangesIsReportedAsItsChangeSays(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(s *kubetest.Server, p *kubeapi.Pod)
		want   func([]Endpoint) bool
	}{
		{"turns not ready: draining", func(s *kubetest.Server, p *kubeapi.Pod) { kubetest.SetReady(p, false); s.Update(*p) },
			is("http://10.0.0.1:8000", false, "http://10.0.0.2:8000", true)},
		{"terminating though still ready: draining", func(s *kubetest.Server, p *kubeapi.Pod) { kubetest.Terminate(p); s.Update(*p) },
			is("http://10.0.0.1:8000", false, "http://10.0.0.2:8000", true)},
		{"finished: gone", func(s *kubetest.Server, p *kubeapi.Pod) { p.Status.Phase = "Failed"; s.Update(*p) }, is("http://10.0.0.2:8000", true)},
		{"deleted: gone", func(s *kubetest.Server, p *kubeapi.Pod) { s.Delete("llm", "vllm-0") }, is("http://10.0.0.2:8000", true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
			s := newCluster(t, p, pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"))
			rec := watch(t, s)
			rec.waitFor(t, "both pods ready", is("http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true))
			tc.change(s, &p)
			rec.waitFor(t, tc.name, tc.want)
		})
	}
}

func TestKubernetesPodWithANewIPIsANewEndpoint(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec := watch(t, s)
	rec.waitFor(t, "the old address", is("http://10.0.0.1:8000", true))
	// A StatefulSet pod recreated under its name comes back with another address.
	s.Delete("llm", "vllm-0")
	s.Create(pod("llm", "vllm-0", "10.0.0.9", true, "app", "vllm"))
	rec.waitFor(t, "only the new address", is("http://10.0.0.9:8000", true))
}

func TestKubernetesWatchesOnlyItsNamespaceAndSelector(t *testing.T) {
	s := newCluster(t, pod("other", "vllm-x", "10.0.1.1", true, "app", "vllm"), pod("llm", "web", "10.0.0.8", true, "app", "web"))
	rec := watch(t, s)
	for _, r := range watchOpen(t, s, 1) {
		if r.Selector != "app=vllm" || r.Namespace != "llm" {
			t.Fatalf("asked the API server for %q in %q, want app=vllm in llm", r.Selector, r.Namespace)
		}
	}
	s.Create(pod("other", "vllm-y", "10.0.1.2", true, "app", "vllm"))
	s.Create(pod("llm", "web-2", "10.0.0.9", true, "app", "web"))
	s.Create(pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm", "tier", "gpu"))
	set := rec.waitFor(t, "the one matching pod", func(s []Endpoint) bool { return len(s) > 0 })
	if !is("http://10.0.0.1:8000", true)(set) {
		t.Fatalf("set %v, want only llm/vllm-0", set)
	}
	// A pod relabelled out of the selector leaves.
	s.Update(pod("llm", "vllm-0", "10.0.0.1", true, "app", "retired"))
	rec.waitFor(t, "the relabelled pod gone", is())
}

func TestKubernetesWatchAsksForBookmarksAndABoundedTimeout(t *testing.T) {
	s := newCluster(t)
	watch(t, s)
	w := lastWatch(watchOpen(t, s, 1))
	secs, err := strconv.Atoi(w.TimeoutSeconds)
	if !w.Bookmarks || err != nil || secs < int(watchTimeout/time.Second) || secs >= int(2*watchTimeout/time.Second) {
		t.Fatalf("watch asked for bookmarks=%v timeoutSeconds=%q", w.Bookmarks, w.TimeoutSeconds)
	}
}

// A watch that the API server ends in order is resumed from the last version it delivered, not
// by listing again, and what changed in between arrives on the new watch.
func TestKubernetesEndedWatchResumesFromTheLastVersionSeen(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec := watch(t, s)
	watchOpen(t, s, 1)
	s.Create(pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"))
	rec.waitFor(t, "vllm-1", is("http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true))
	seen := s.Version()
	s.EndWatches()
	rs := watchOpen(t, s, 2)
	if w := lastWatch(rs); w.ResourceVersion != seen {
		t.Fatalf("watched again from %q, want %q", w.ResourceVersion, seen)
	}
	if n := lists(rs); n != 1 {
		t.Fatalf("%d lists; an ended watch is resumed, not relisted", n)
	}
	s.Delete("llm", "vllm-0")
	rec.waitFor(t, "a deletion on the new watch", is("http://10.0.0.2:8000", true))
}

// A bookmark moves the version a watch resumes from, so a watch that saw no pod change for
// longer than the API server keeps history resumes rather than listing again.
func TestKubernetesBookmarkIsWhereTheNextWatchStarts(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	watch(t, s)
	watchOpen(t, s, 1)
	s.Bookmark()
	mark := s.Version()
	// The bookmark has arrived once a watch resumes from it; until then, end the watch each time
	// it has been opened again and not from there.
	for i := 2; ; i++ {
		s.EndWatches()
		rs := watchOpen(t, s, i)
		if lastWatch(rs).ResourceVersion == mark {
			if n := lists(rs); n != 1 {
				t.Fatalf("%d lists", n)
			}
			return
		}
		if i > 50 {
			t.Fatalf("no watch from the bookmark's version %s: %+v", mark, rs)
		}
		s.Bookmark()
		mark = s.Version()
	}
}

// A watch the API server ends as expired (an ERROR event with code 410) makes the source list
// again; what changed while the watch was not delivering (here: everything) shows in the next
// set, and the new watch starts from the new list.
func TestKubernetesRelistAfterAnExpiredWatchCatchesUp(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec := watch(t, s)
	rec.waitFor(t, "vllm-0", is("http://10.0.0.1:8000", true))
	watchOpen(t, s, 1)
	s.Hold() // the open watch goes stale: it delivers none of these
	s.Delete("llm", "vllm-0")
	s.Create(pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"))
	s.Expire()
	rec.waitFor(t, "the relisted state", is("http://10.0.0.2:8000", true))
	rs := watchOpen(t, s, 2)
	if n := lists(rs); n != 2 {
		t.Fatalf("%d lists, want a second one after the expiry", n)
	}
	s.Create(pod("llm", "vllm-2", "10.0.0.3", true, "app", "vllm"))
	rec.waitFor(t, "a pod added on the new watch", is("http://10.0.0.2:8000", true, "http://10.0.0.3:8000", true))
}

// A watch refused at once with 410 Gone (its version is older than the API server's history)
// makes the source list again too.
func TestKubernetesWatchAnsweredGoneListsAgain(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec := watch(t, s)
	watchOpen(t, s, 1)
	s.Hold()
	s.Create(pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"))
	s.Compact()
	s.EndWatches()
	rec.waitFor(t, "the relisted state", is("http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true))
	rs := s.Requests()
	gone := false
	for _, r := range rs {
		gone = gone || (r.Watch && r.Status == 410)
	}
	if !gone || lists(rs) != 2 {
		t.Fatalf("want a watch answered 410 then a second list: %+v", rs)
	}
}

// A namespace larger than a page is read page by page, and every page counts.
func TestKubernetesListsEveryPage(t *testing.T) {
	s := newCluster(t)
	const n = 501
	for i := range n {
		s.Create(pod("llm", "vllm-"+strconv.Itoa(i), "10.0."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1), true, "app", "vllm"))
	}
	rec := watch(t, s)
	set := rec.waitFor(t, "every pod", func(s []Endpoint) bool { return len(s) == n })
	if len(set) != n || lists(s.Requests()) != 2 || s.Requests()[1].Continue == "" {
		t.Fatalf("%d endpoints from %+v", len(set), s.Requests()[:2])
	}
}

func TestKubernetesReportsOnlyChanges(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	s := newCluster(t, p)
	rec := watch(t, s)
	rec.waitFor(t, "the pod", is("http://10.0.0.1:8000", true))
	_, before := rec.last()
	// A change the set does not show (a new label) reports nothing.
	p.Metadata.Labels["rev"] = "2"
	s.Update(p)
	kubetest.SetReady(&p, false)
	s.Update(p)
	rec.waitFor(t, "not ready", is("http://10.0.0.1:8000", false))
	if _, after := rec.last(); after != before+1 {
		t.Fatalf("%d sets reported for one change", after-before)
	}
}

// In a pod, the source authenticates with the service account token over TLS, and reads the
// token file again when the kubelet replaces it: a watch refused because the old token was
// revoked is tried again, with the new token once it is in the file.
func TestKubernetesInClusterTokenRotationIsFollowed(t *testing.T) {
	s := kubetest.NewTLS(t, nil)
	s.Create(pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	s.SetToken("token-one")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "token"), "token-one\n")
	writeFile(t, filepath.Join(dir, "ca.crt"), string(s.CertificatePEM()))
	host, port, _ := strings.Cut(strings.TrimPrefix(s.URL, "https://"), ":")
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	cfg, err := kubeapi.InClusterFrom(dir, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := watchPods(t, client, nil)
	rec.waitFor(t, "the pod", is("http://10.0.0.1:8000", true))
	watchOpen(t, s, 1)

	s.SetToken("token-two") // the old token is revoked before the file changes
	s.EndWatches()
	s.WaitFor(t, "a watch refused", func(rs []kubetest.Request) bool {
		return lastWatch(rs).Status == 401 && lastWatch(rs).Authorization == "Bearer token-one"
	})
	writeFile(t, filepath.Join(dir, "token"), "token-two\n") // the kubelet's rotation
	rs := watchOpen(t, s, 2)
	if w := lastWatch(rs); w.Authorization != "Bearer token-two" {
		t.Fatalf("the watch after the rotation carried %q", w.Authorization)
	}
	s.Delete("llm", "vllm-0")
	rec.waitFor(t, "a deletion seen with the new token", is())
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestPodEndpoint(t *testing.T) {
	v6 := pod("llm", "v6", "fd00::5", true)
	if e, ok := PodEndpoint(&v6, 8000); !ok || e.URL != "http://[fd00::5]:8000" || !e.Ready {
		t.Fatalf("IPv6 pod: %v %v", e, ok)
	}
	pending := pod("llm", "p", "", true)
	if _, ok := PodEndpoint(&pending, 8000); ok {
		t.Fatal("a pod without an IP is an endpoint")
	}
	done := pod("llm", "d", "10.0.0.1", false)
	done.Status.Phase = "Succeeded"
	if _, ok := PodEndpoint(&done, 8000); ok {
		t.Fatal("a finished pod is an endpoint")
	}
	noCond := pod("llm", "n", "10.0.0.1", true)
	noCond.Status.Conditions = nil
	if e, ok := PodEndpoint(&noCond, 9000); !ok || e.Ready || e.URL != "http://10.0.0.1:9000" {
		t.Fatalf("a pod with no Ready condition: %v %v", e, ok)
	}
}

// A pod as the API server sends it, spec and all, is kept as its name, labels, IP, phase,
// deletion mark and Ready condition.
func TestSlimPodKeepsWhatTheSourceReads(t *testing.T) {
	wire := `{"metadata":{"name":"vllm-0","namespace":"llm","uid":"u1","resourceVersion":"7","labels":{"app":"vllm"},
	"annotations":{"big":"` + strings.Repeat("y", 4096) + `","cacheroute.io/kv-events-endpoint":"tcp://{host}:5557",
	"cacheroute.io/kv-events-replay-endpoint":"tcp://` + strings.Repeat("r", 4096) + `:5558"},"deletionTimestamp":"2026-01-02T03:04:05Z",
	"managedFields":[{"manager":"kubelet"}]},
	"spec":{"containers":[{"name":"vllm","image":"vllm/vllm-openai","args":["` + strings.Repeat("x", 4096) + `"]}]},
	"status":{"phase":"Running","podIP":"10.0.0.1","conditions":[{"type":"PodScheduled","status":"True"},{"type":"Ready","status":"True","lastTransitionTime":"2026-01-02T03:04:05Z"}]}}`
	var p kubeapi.Pod
	if err := json.Unmarshal([]byte(wire), &p); err != nil {
		t.Fatal(err)
	}
	s := slimPod(p)
	if len(s.Status.Conditions) != 1 || s.Metadata.UID != "" || s.Metadata.ResourceVersion != "" {
		t.Fatalf("slim pod keeps %d conditions, uid %q, version %q", len(s.Status.Conditions), s.Metadata.UID, s.Metadata.ResourceVersion)
	}
	if b, _ := json.Marshal(s); len(b) > 300+kvevents.MaxEndpointLen+100 {
		t.Fatalf("slim pod is %d bytes: %s", len(b), b)
	}
	if s.Metadata.Annotations[AnnotationKVEventsEndpoint] != "tcp://{host}:5557" || len(s.Metadata.Annotations) != 2 {
		t.Fatalf("slim pod's annotations %v, want the event endpoints' only", s.Metadata.Annotations)
	}
	if _, err := PodKVEvents(&s); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("an overlong annotation, cut when kept: %v, want refused as too long", err)
	}
	want, _ := PodEndpoint(&p, 8000)
	if got, _ := PodEndpoint(&s, 8000); got != want || want.Ready || s.Metadata.Labels["app"] != "vllm" {
		t.Fatalf("slim pod's endpoint %v, want %v (draining)", got, want)
	}
}

func TestDefaultNamespaceIsTheServiceAccountsElseDefault(t *testing.T) {
	file := filepath.Join(t.TempDir(), "namespace")
	if got := namespaceFrom(file); got != "default" {
		t.Fatalf("no file: %q", got)
	}
	if err := os.WriteFile(file, []byte("llm-prod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := namespaceFrom(file); got != "llm-prod" {
		t.Fatalf("from file: %q", got)
	}
}

func TestNewKubernetesRejectsWhatWouldWatchTooMuch(t *testing.T) {
	client, err := kubeapi.New(kubeapi.Config{Server: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []KubernetesOptions{
		{Client: client, Namespace: "llm", Selector: "", Port: 8000},
		{Client: client, Namespace: "llm", Selector: "app in (", Port: 8000},
		{Client: client, Namespace: "", Selector: "app=vllm", Port: 8000},
		{Client: client, Namespace: "llm", Selector: "app=vllm", Port: 0},
		{Namespace: "llm", Selector: "app=vllm", Port: 8000},
	} {
		if _, err := NewKubernetes(opts); err == nil {
			t.Errorf("NewKubernetes(%+v) accepted", opts)
		}
	}
}

// A list the API server refuses (missing RBAC rights) is said through the router's logger, with
// the reason, and tried again until it is allowed.
func TestKubernetesRefusedListIsLoggedThroughTheRoutersLogger(t *testing.T) {
	s := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	s.RefuseLists(&kubeapi.Status{Code: 403, Reason: "Forbidden",
		Message: `pods is forbidden: User "system:serviceaccount:llm:cacheroute" cannot list resource "pods"`})
	var buf testkit.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	src, err := NewKubernetes(KubernetesOptions{Client: s.Client(t), Namespace: "llm", Selector: "app=vllm", Port: 8000, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	rec := runSource(t, src)
	s.WaitFor(t, "two refused lists", func(rs []kubetest.Request) bool { return lists(rs) >= 2 })
	if !testkit.Poll(testkit.Patience, 10*time.Millisecond, func() bool { return strings.Count(buf.String(), "cannot list resource") >= 2 }) {
		t.Fatalf("no log of each refused list; log: %s", buf.String())
	}
	if !strings.Contains(buf.String(), "discovery=kubernetes") {
		t.Fatalf("the log does not name the source: %s", buf.String())
	}
	if _, n := rec.last(); n != 0 {
		t.Fatal("a set was reported though nothing could be listed")
	}
	s.RefuseLists(nil)
	rec.waitFor(t, "the pod once the list is allowed", is("http://10.0.0.1:8000", true))
}

func annotate(p *kubeapi.Pod, kv ...string) {
	p.Metadata.Annotations = map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Metadata.Annotations[kv[i]] = kv[i+1]
	}
}

// A pod's annotations name its worker's event endpoints; a later change of them is reported; one
// that cannot be used is logged once and the pod is still wanted, without endpoints of its own.
func TestKubernetesPodAnnotationsNameTheWorkersEventEndpoints(t *testing.T) {
	s := newCluster(t)
	var buf testkit.SyncBuffer
	rec := watchPods(t, s.Client(t), slog.New(slog.NewTextHandler(&buf, nil)))
	events := func(want kvevents.WorkerEndpoints, ready bool) func([]Endpoint) bool {
		return func(set []Endpoint) bool {
			return is("http://10.0.0.1:8000", ready)(set) && set[0].KVEvents == want
		}
	}
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	annotate(&p, AnnotationKVEventsEndpoint, "tcp://{host}:5557", AnnotationKVEventsReplayEndpoint, "tcp://{host}:5558")
	s.Create(p)
	rec.waitFor(t, "the pod with its endpoints", events(kvevents.WorkerEndpoints{Events: "tcp://{host}:5557", Replay: "tcp://{host}:5558"}, true))

	annotate(&p, AnnotationKVEventsEndpoint, "tcp://10.0.0.1:6557")
	s.Update(p)
	rec.waitFor(t, "the pod with its changed endpoint", events(kvevents.WorkerEndpoints{Events: "tcp://10.0.0.1:6557"}, true))

	annotate(&p, AnnotationKVEventsEndpoint, "tcp://*:5557")
	s.Update(p)
	rec.waitFor(t, "the pod without endpoints of its own", events(kvevents.WorkerEndpoints{}, true))
	kubetest.SetReady(&p, false)
	s.Update(p)
	rec.waitFor(t, "the pod draining, still without", events(kvevents.WorkerEndpoints{}, false))
	if n := strings.Count(buf.String(), "kv events annotation is refused"); n != 1 || !strings.Contains(buf.String(), "wildcard") {
		t.Fatalf("the refused annotation was logged %d times, want once with why; log: %s", n, buf.String())
	}
}
