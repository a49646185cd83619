package discovery

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// pod is a running pod in ns with the given IP ("" for none yet), Ready condition and labels.
func pod(ns, name, ip string, ready bool, labels ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	for i := 0; i+1 < len(labels); i += 2 {
		p.Labels[labels[i]] = labels[i+1]
	}
	setReady(p, ready)
	return p
}

func setReady(p *corev1.Pod, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodReady, Status: status},
	}
}

// cluster is a fake API server with a source watching namespace "llm" for app=vllm on port 8000.
type cluster struct {
	client  *fake.Clientset
	watches chan string // the label selector of every watch the source opens
	lists   chan string // ... and of every list
}

func newCluster(t *testing.T, objs ...runtime.Object) *cluster {
	t.Helper()
	c := &cluster{client: fake.NewClientset(objs...), watches: make(chan string, 16), lists: make(chan string, 16)}
	c.client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		c.watches <- a.(k8stesting.WatchActionImpl).WatchRestrictions.Labels.String()
		return false, nil, nil
	})
	c.client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c.lists <- a.(k8stesting.ListActionImpl).ListRestrictions.Labels.String()
		return false, nil, nil
	})
	return c
}

// watch starts a source on c and waits until its watch is open, so no later change is missed
// (the fake API server does not replay changes made between a list and a watch).
func (c *cluster) watch(t *testing.T) *recorder {
	t.Helper()
	src, err := NewKubernetes(KubernetesOptions{Client: c.client, Namespace: "llm", Selector: "app=vllm", Port: 8000})
	if err != nil {
		t.Fatal(err)
	}
	rec := runSource(t, src)
	select {
	case <-c.watches:
	case <-time.After(10 * time.Second):
		t.Fatal("the source opened no watch")
	}
	rec.waitFor(t, "the first set", func([]Endpoint) bool { return true })
	return rec
}

func (c *cluster) create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) update(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) delete(t *testing.T, ns, name string) {
	t.Helper()
	if err := c.client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestKubernetesListsExistingPodsAtStart(t *testing.T) {
	c := newCluster(t, pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"), pod("llm", "vllm-0", "10.0.0.1", false, "app", "vllm"))
	rec := c.watch(t)
	rec.waitFor(t, "both pods", is("http://10.0.0.1:8000", false, "http://10.0.0.2:8000", true))
	set, _ := rec.last()
	if set[0].Name != "llm/vllm-0" || set[1].Name != "llm/vllm-1" {
		t.Fatalf("names %q %q", set[0].Name, set[1].Name)
	}
}

func TestKubernetesAddedReadyPodIsWantedReady(t *testing.T) {
	c := newCluster(t)
	rec := c.watch(t)
	if set, _ := rec.last(); len(set) != 0 {
		t.Fatalf("empty cluster reported %v", set)
	}
	c.create(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	rec.waitFor(t, "the new pod, ready", is("http://10.0.0.1:8000", true))
}

func TestKubernetesPodIsWantedOnceItHasAnIPAndReadyOnceItIsReady(t *testing.T) {
	c := newCluster(t)
	rec := c.watch(t)
	p := pod("llm", "vllm-0", "", false, "app", "vllm")
	c.create(t, p)
	p.Status.PodIP = "10.0.0.1"
	c.update(t, p)
	rec.waitFor(t, "the pod with its IP, not ready", is("http://10.0.0.1:8000", false))
	setReady(p, true)
	c.update(t, p)
	rec.waitFor(t, "the pod ready", is("http://10.0.0.1:8000", true))
}

func TestKubernetesPodThatTurnsNotReadyIsReportedDraining(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	c := newCluster(t, p)
	rec := c.watch(t)
	rec.waitFor(t, "the pod ready", is("http://10.0.0.1:8000", true))
	setReady(p, false)
	c.update(t, p)
	rec.waitFor(t, "the pod not ready but still wanted", is("http://10.0.0.1:8000", false))
}

func TestKubernetesTerminatingPodIsReportedDrainingThoughStillReady(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	c := newCluster(t, p)
	rec := c.watch(t)
	rec.waitFor(t, "the pod ready", is("http://10.0.0.1:8000", true))
	now := metav1.Now()
	p.DeletionTimestamp = &now
	c.update(t, p)
	rec.waitFor(t, "the terminating pod draining", is("http://10.0.0.1:8000", false))
}

func TestKubernetesDeletedPodLeaves(t *testing.T) {
	c := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"), pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm"))
	rec := c.watch(t)
	rec.waitFor(t, "two pods", is("http://10.0.0.1:8000", true, "http://10.0.0.2:8000", true))
	c.delete(t, "llm", "vllm-0")
	rec.waitFor(t, "vllm-0 gone", is("http://10.0.0.2:8000", true))
}

func TestKubernetesFinishedPodLeaves(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	c := newCluster(t, p)
	rec := c.watch(t)
	rec.waitFor(t, "the pod", is("http://10.0.0.1:8000", true))
	p.Status.Phase = corev1.PodFailed
	c.update(t, p)
	rec.waitFor(t, "the failed pod gone", is())
}

func TestKubernetesPodWithANewIPIsANewEndpoint(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	c := newCluster(t, p)
	rec := c.watch(t)
	rec.waitFor(t, "the old address", is("http://10.0.0.1:8000", true))
	// A StatefulSet pod recreated under its name comes back with another address.
	c.delete(t, "llm", "vllm-0")
	c.create(t, pod("llm", "vllm-0", "10.0.0.9", true, "app", "vllm"))
	rec.waitFor(t, "only the new address", is("http://10.0.0.9:8000", true))
}

func TestKubernetesWatchesOnlyItsNamespaceAndSelector(t *testing.T) {
	c := newCluster(t, pod("other", "vllm-x", "10.0.1.1", true, "app", "vllm"), pod("llm", "web", "10.0.0.8", true, "app", "web"))
	rec := c.watch(t)
	if sel := <-c.lists; sel != "app=vllm" {
		t.Fatalf("list asked the API server for %q, want app=vllm", sel)
	}
	c.create(t, pod("other", "vllm-y", "10.0.1.2", true, "app", "vllm"))
	c.create(t, pod("llm", "web-2", "10.0.0.9", true, "app", "web"))
	c.create(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm", "tier", "gpu"))
	set := rec.waitFor(t, "the one matching pod", func(s []Endpoint) bool { return len(s) > 0 })
	if !is("http://10.0.0.1:8000", true)(set) {
		t.Fatalf("set %v, want only llm/vllm-0", set)
	}
	// A pod relabelled out of the selector leaves.
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "retired")
	if _, err := c.client.CoreV1().Pods("llm").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "the relabelled pod gone", is())
}

// A watch the API server ends as expired (410) makes the informer list again; what changed while
// the watch was not delivering (here: everything) shows in the next set.
func TestKubernetesRelistAfterAnExpiredWatchCatchesUp(t *testing.T) {
	c := newCluster(t, pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm"))
	stale := watch.NewFake()
	var once sync.Once
	c.client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		handled := false
		once.Do(func() { handled = true })
		if handled {
			c.watches <- "stale"
			return true, stale, nil // the first watch: it will deliver nothing, then expire
		}
		return false, nil, nil
	})
	rec := c.watch(t)
	rec.waitFor(t, "vllm-0", is("http://10.0.0.1:8000", true))
	// Changes the stale watch does not deliver.
	tracker := c.client.Tracker()
	if err := tracker.Delete(corev1.SchemeGroupVersion.WithResource("pods"), "llm", "vllm-0"); err != nil {
		t.Fatal(err)
	}
	if err := tracker.Add(pod("llm", "vllm-1", "10.0.0.2", true, "app", "vllm")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if set, _ := rec.last(); !is("http://10.0.0.1:8000", true)(set) {
		t.Fatalf("the stale watch delivered something: %v", set)
	}
	stale.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	rec.waitFor(t, "the relisted state", is("http://10.0.0.2:8000", true))
	select {
	case <-c.watches: // and it watches again
	case <-time.After(10 * time.Second):
		t.Fatal("no new watch after the relist")
	}
	c.create(t, pod("llm", "vllm-2", "10.0.0.3", true, "app", "vllm"))
	rec.waitFor(t, "a pod added on the new watch", is("http://10.0.0.2:8000", true, "http://10.0.0.3:8000", true))
}

func TestKubernetesReportsOnlyChanges(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	c := newCluster(t, p)
	rec := c.watch(t)
	rec.waitFor(t, "the pod", is("http://10.0.0.1:8000", true))
	_, before := rec.last()
	// A change the set does not show (a new label) reports nothing.
	p.Labels["rev"] = "2"
	c.update(t, p)
	setReady(p, false)
	c.update(t, p)
	rec.waitFor(t, "not ready", is("http://10.0.0.1:8000", false))
	if _, after := rec.last(); after != before+1 {
		t.Fatalf("%d sets reported for one change", after-before)
	}
}

func TestPodEndpoint(t *testing.T) {
	v6 := pod("llm", "v6", "fd00::5", true)
	if e, ok := PodEndpoint(v6, 8000); !ok || e.URL != "http://[fd00::5]:8000" || !e.Ready {
		t.Fatalf("IPv6 pod: %v %v", e, ok)
	}
	pending := pod("llm", "p", "", true)
	if _, ok := PodEndpoint(pending, 8000); ok {
		t.Fatal("a pod without an IP is an endpoint")
	}
	done := pod("llm", "d", "10.0.0.1", false)
	done.Status.Phase = corev1.PodSucceeded
	if _, ok := PodEndpoint(done, 8000); ok {
		t.Fatal("a finished pod is an endpoint")
	}
	noCond := pod("llm", "n", "10.0.0.1", true)
	noCond.Status.Conditions = nil
	if e, ok := PodEndpoint(noCond, 9000); !ok || e.Ready || e.URL != "http://10.0.0.1:9000" {
		t.Fatalf("a pod with no Ready condition: %v %v", e, ok)
	}
}

func TestSlimPodKeepsWhatTheSourceReads(t *testing.T) {
	p := pod("llm", "vllm-0", "10.0.0.1", true, "app", "vllm")
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", Args: []string{strings.Repeat("x", 4096)}}}
	p.Annotations = map[string]string{"big": strings.Repeat("y", 4096)}
	out, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Pod)
	if len(s.Spec.Containers) != 0 || s.Annotations != nil || len(s.Status.Conditions) != 1 {
		t.Fatalf("slim pod keeps %d containers, annotations %v, %d conditions", len(s.Spec.Containers), s.Annotations, len(s.Status.Conditions))
	}
	want, _ := PodEndpoint(p, 8000)
	if got, _ := PodEndpoint(s, 8000); got != want || s.Labels["app"] != "vllm" {
		t.Fatalf("slim pod's endpoint %v, want %v", got, want)
	}
	if other, _ := slimPod("not a pod"); other != "not a pod" {
		t.Fatal("slimPod changed a non-pod")
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
	client := fake.NewClientset()
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
// the reason, rather than only on klog's standard error.
func TestKubernetesRefusedListIsLoggedThroughTheRoutersLogger(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New(`User "system:serviceaccount:llm:cacheroute" cannot list resource "pods"`))
	})
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	src, err := NewKubernetes(KubernetesOptions{Client: client, Namespace: "llm", Selector: "app=vllm", Port: 8000, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	rec := runSource(t, src)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "cannot list resource") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the refused list; log: %s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(buf.String(), "discovery=kubernetes") {
		t.Fatalf("the log does not name the source: %s", buf.String())
	}
	if _, n := rec.last(); n != 0 {
		t.Fatal("a set was reported though nothing could be listed")
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
