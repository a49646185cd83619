package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// KubernetesOptions configure the pod source.
type KubernetesOptions struct {
	Client    *kubeapi.Client
	Namespace string // the one namespace watched
	Selector  string // label selector of the worker pods, e.g. "app=vllm,tier=gpu"; must not be empty
	Port      int    // the workers' port on each pod's IP
	// Role is the role of the workers the selector finds (colocated: --selector; prefill:
	// --prefill-selector; decode: --decode-selector).
	Role workers.Role
	Log  *slog.Logger
}

// Kubernetes watches the pods of one namespace that match a label selector. Every pod with an
// IP that has not finished (phase Succeeded or Failed) is wanted: ready when its Ready condition
// is true and it is not being deleted, draining otherwise. A pod leaves the set when it is
// deleted, finishes, or stops matching the selector.
//
// It watches pods rather than EndpointSlices: the selector is the pods' own labels (as with the
// vLLM router's --selector), no Service is needed, and a pod's readiness and deletion reach the
// router straight from the API server instead of through the EndpointSlice controller.
type Kubernetes struct {
	opts KubernetesOptions
	sel  kubeapi.Selector
	log  *slog.Logger
	// badEvents are the pods whose event annotations were refused, with the error, so that each
	// is logged once, not at every report; only pods still held are kept.
	badEvents map[string]string
}

// The pod annotations that name a worker's own KV-cache event endpoints, in place of the
// --kv-events-endpoint template: tcp://HOST:PORT, HOST the pod's IP or kvevents.HostPlaceholder
// for it, the port offset by each data-parallel rank as the template's is.
const (
	AnnotationKVEventsEndpoint       = "cacheroute.io/kv-events-endpoint"
	AnnotationKVEventsReplayEndpoint = "cacheroute.io/kv-events-replay-endpoint"
)

// The pace of the list and watch. Each watch asks the API server to end it after a random time
// between watchTimeout and twice that, so that replicas started together do not come back in
// step; it is then resumed from the last resource version seen. A list or watch that fails is
// tried again after a pause that doubles from retryMin up to retryMax, and starts again from
// retryMin once a watch has delivered something or lasted a second.
const (
	watchTimeout = 5 * time.Minute
	retryMin     = 200 * time.Millisecond
	retryMax     = 30 * time.Second
	watchUseful  = time.Second
)

// NewKubernetes checks opts and returns the source; it does not contact the API server.
func NewKubernetes(opts KubernetesOptions) (*Kubernetes, error) {
	if opts.Client == nil {
		return nil, errors.New("discovery: no Kubernetes client")
	}
	sel, err := kubeapi.ParseSelector(opts.Selector)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if opts.Namespace == "" {
		return nil, errors.New("discovery: no namespace")
	}
	if opts.Port < 1 || opts.Port > 65535 {
		return nil, fmt.Errorf("discovery: %d is not a port number", opts.Port)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	k := &Kubernetes{opts: opts, sel: sel, badEvents: map[string]string{}}
	k.log = opts.Log.With("discovery", k.Name())
	return k, nil
}

// Name is "kubernetes" for the colocated workers' selector, "kubernetes-prefill" and
// "kubernetes-decode" for the roles' own.
func (k *Kubernetes) Name() string {
	if k.opts.Role == workers.RoleColocated {
		return "kubernetes"
	}
	return "kubernetes-" + k.opts.Role.String()
}

// Run lists the pods, then watches them from the list's resource version, resuming the watch
// from the last version seen each time it ends, and listing again when the API server answers
// that the version is too old (410 Gone). It reports the wanted set once the first list is in,
// then after every change; the events of a burst are reported as one set. A list or watch that
// fails is logged and tried again with backoff, and the set stays as it was meanwhile: nothing
// is removed for lack of news. Run returns only when ctx ends.
func (k *Kubernetes) Run(ctx context.Context, update func([]Endpoint)) error {
	var (
		pods     map[string]kubeapi.Pod // name → slim pod
		rv       string                 // "" until listed, and after a 410
		last     []Endpoint
		reported bool
		pause    = retryMin
	)
	report := func() {
		set := k.endpoints(pods)
		if reported && Equal(set, last) {
			return
		}
		reported, last = true, set
		update(set)
	}
	wait := func() error {
		t := time.NewTimer(pause)
		defer t.Stop()
		pause = min(2*pause, retryMax)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	for {
		if rv == "" {
			fresh, v, err := k.list(ctx)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				k.log.Warn("discovery: pods not listed; trying again", "namespace", k.opts.Namespace, "error", err, "in", pause)
				if err := wait(); err != nil {
					return err
				}
				continue
			}
			if !reported {
				k.log.Info("discovery: pods listed", "namespace", k.opts.Namespace, "selector", k.sel.String(), "pods", len(fresh))
			} else {
				k.log.Info("discovery: pods listed again", "namespace", k.opts.Namespace, "pods", len(fresh))
			}
			pods, rv = fresh, v
			report()
		}
		start := time.Now()
		next, delivered, err := k.watch(ctx, rv, pods, report)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rv = next
		if kubeapi.IsGone(err) {
			k.log.Info("discovery: the watch's resource version expired; listing again", "error", err)
			rv = ""
		} else if err != nil {
			k.log.Warn("discovery: pod watch failed; watching again", "error", err, "in", pause)
		}
		if delivered || time.Since(start) >= watchUseful {
			pause = retryMin
			continue
		}
		if err := wait(); err != nil {
			return err
		}
	}
}

// list reads every page of the matching pods, and the version to watch from.
func (k *Kubernetes) list(ctx context.Context) (map[string]kubeapi.Pod, string, error) {
	pods := map[string]kubeapi.Pod{}
	cont := ""
	for {
		page, err := k.opts.Client.ListPods(ctx, k.opts.Namespace, k.sel, cont)
		if err != nil {
			return nil, "", err
		}
		for _, p := range page.Items {
			pods[p.Metadata.Name] = slimPod(p)
		}
		if cont = page.Metadata.Continue; cont == "" {
			return pods, page.Metadata.ResourceVersion, nil
		}
	}
}

// watch applies the events of one watch from rv to pods, calling report whenever no further
// event is waiting, until the watch ends. It returns the last resource version seen, whether an
// event came, and why it ended (nil for an orderly end).
func (k *Kubernetes) watch(ctx context.Context, rv string, pods map[string]kubeapi.Pod, report func()) (string, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timeout := watchTimeout + rand.N(watchTimeout)
	w, err := k.opts.Client.WatchPods(ctx, k.opts.Namespace, k.sel, rv, timeout)
	if err != nil {
		return rv, false, err
	}
	defer w.Close()
	type next struct {
		ev  kubeapi.Event
		err error
	}
	events := make(chan next, 64)
	go func() {
		for {
			ev, err := w.Next()
			select {
			case events <- next{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	delivered, dirty := false, false
	for {
		var n next
		select {
		case n = <-events:
		default:
			if dirty {
				report()
				dirty = false
			}
			select {
			case n = <-events:
			case <-ctx.Done():
				return rv, delivered, ctx.Err()
			}
		}
		if n.err == nil && n.ev.Type == kubeapi.Error {
			n.err = n.ev.Err
		}
		if n.err != nil {
			if dirty {
				report()
			}
			if errors.Is(n.err, io.EOF) {
				n.err = nil
			}
			return rv, delivered, n.err
		}
		delivered = true
		p := n.ev.Pod
		switch n.ev.Type {
		case kubeapi.Added, kubeapi.Modified:
			pods[p.Metadata.Name] = slimPod(p)
			dirty = true
		case kubeapi.Deleted:
			delete(pods, p.Metadata.Name)
			dirty = true
		}
		if v := p.Metadata.ResourceVersion; v != "" {
			rv = v
		}
	}
}

// endpoints turns the stored pods into the wanted set. The namespace and selector are checked
// here too: the API server applies them to the list and watch already, and checking again costs
// nothing.
func (k *Kubernetes) endpoints(pods map[string]kubeapi.Pod) []Endpoint {
	eps := make([]Endpoint, 0, len(pods))
	for name, p := range pods {
		if p.Metadata.Namespace != k.opts.Namespace || !k.sel.Matches(p.Metadata.Labels) {
			continue
		}
		if e, ok := PodEndpoint(&p, k.opts.Port); ok {
			e.Role = k.opts.Role
			eps = append(eps, e)
		}
		if _, err := PodKVEvents(&p); err == nil {
			delete(k.badEvents, name)
		} else if k.badEvents[name] != err.Error() {
			k.badEvents[name] = err.Error()
			k.log.Warn("discovery: the pod's kv events annotation is refused; the worker joins without events of its own",
				"pod", p.Metadata.Namespace+"/"+name, "error", err)
		}
	}
	for name := range k.badEvents {
		if _, ok := pods[name]; !ok {
			delete(k.badEvents, name)
		}
	}
	return normalize(eps)
}

// PodEndpoint is the worker a pod stands for, on port: none while the pod has no IP or once it
// has finished; draining while it is not Ready or is being deleted. Its event endpoints are the
// pod's annotations', when they pass their check (PodKVEvents), else none.
func PodEndpoint(p *kubeapi.Pod, port int) (Endpoint, bool) {
	if p.Status.PodIP == "" || p.Finished() {
		return Endpoint{}, false
	}
	ev, _ := PodKVEvents(p)
	return Endpoint{
		URL:      "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)),
		Ready:    p.Ready() && p.Metadata.DeletionTimestamp == nil,
		Name:     p.Metadata.Namespace + "/" + p.Metadata.Name,
		KVEvents: ev,
	}, true
}

// PodKVEvents are the event endpoints p's annotations name (AnnotationKVEventsEndpoint,
// AnnotationKVEventsReplayEndpoint), checked as every worker's own are (kvevents.WorkerEndpoints);
// zero without the annotations, and with an error when they cannot be used.
func PodKVEvents(p *kubeapi.Pod) (kvevents.WorkerEndpoints, error) {
	ev := kvevents.WorkerEndpoints{
		Events: p.Metadata.Annotations[AnnotationKVEventsEndpoint],
		Replay: p.Metadata.Annotations[AnnotationKVEventsReplayEndpoint],
	}
	if err := ev.Check(); err != nil {
		return kvevents.WorkerEndpoints{}, err
	}
	return ev, nil
}

// slimPod keeps only what PodEndpoint and the selector read (the decoder has dropped the rest
// of the pod already), so the source holds little more than a pod's labels per pod: of its
// annotations only the event endpoints', each cut one byte past kvevents.MaxEndpointLen, so that
// one too long is still refused as too long.
func slimPod(p kubeapi.Pod) kubeapi.Pod {
	var s kubeapi.Pod
	s.Metadata.Name, s.Metadata.Namespace = p.Metadata.Name, p.Metadata.Namespace
	s.Metadata.Labels, s.Metadata.DeletionTimestamp = p.Metadata.Labels, p.Metadata.DeletionTimestamp
	for _, key := range []string{AnnotationKVEventsEndpoint, AnnotationKVEventsReplayEndpoint} {
		if v, ok := p.Metadata.Annotations[key]; ok {
			if s.Metadata.Annotations == nil {
				s.Metadata.Annotations = map[string]string{}
			}
			s.Metadata.Annotations[key] = strings.Clone(v[:min(len(v), kvevents.MaxEndpointLen+1)])
		}
	}
	s.Status.Phase, s.Status.PodIP = p.Status.Phase, p.Status.PodIP
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			s.Status.Conditions = []kubeapi.PodCondition{c}
		}
	}
	return s
}

// NewClient connects to the API server with kubeconfig, or with the pod's service account when
// kubeconfig is empty.
func NewClient(kubeconfig string) (*kubeapi.Client, error) {
	var cfg kubeapi.Config
	var err error
	if kubeconfig == "" {
		if cfg, err = kubeapi.InCluster(); err != nil {
			return nil, fmt.Errorf("not running in a cluster (%w); give --kubeconfig", err)
		}
	} else if cfg, err = kubeapi.LoadKubeconfig(kubeconfig); err != nil {
		return nil, err
	}
	return kubeapi.New(cfg)
}

// DefaultNamespace is the namespace of the pod the router runs in, from its service account, or
// "default" outside a pod.
func DefaultNamespace() string {
	return namespaceFrom(filepath.Join(kubeapi.ServiceAccountDir, "namespace"))
}

func namespaceFrom(file string) string {
	if b, err := os.ReadFile(file); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}
