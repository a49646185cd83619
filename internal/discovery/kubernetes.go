package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// KubernetesOptions configure the pod source.
type KubernetesOptions struct {
	Client    kubernetes.Interface
	Namespace string // the one namespace watched
	Selector  string // label selector of the worker pods, e.g. "app=vllm,tier=gpu"; must not be empty
	Port      int    // the workers' port on each pod's IP
	Log       *slog.Logger
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
	opts     KubernetesOptions
	selector labels.Selector
}

// NewKubernetes checks opts and returns the source; it does not contact the API server.
func NewKubernetes(opts KubernetesOptions) (*Kubernetes, error) {
	if opts.Client == nil {
		return nil, errors.New("discovery: no Kubernetes client")
	}
	if strings.TrimSpace(opts.Selector) == "" {
		return nil, errors.New("discovery: an empty selector would match every pod of the namespace")
	}
	sel, err := labels.Parse(opts.Selector)
	if err != nil {
		return nil, fmt.Errorf("discovery: selector %q: %w", opts.Selector, err)
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
	return &Kubernetes{opts: opts, selector: sel}, nil
}

// Name is "kubernetes".
func (k *Kubernetes) Name() string { return "kubernetes" }

// Run starts a pod informer (a list, then a watch that is resumed, or replaced by a fresh list
// when the API server has expired it) and reports the wanted set once the first list is in, then
// after every change. Bursts of pod events are reported as one set.
func (k *Kubernetes) Run(ctx context.Context, update func([]Endpoint)) error {
	pods := k.opts.Client.CoreV1().Pods(k.opts.Namespace)
	narrow := func(o *metav1.ListOptions) { o.LabelSelector = k.selector.String() }
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default: // a report is already due; it will read the store as it is then
		}
	}
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		// Wrapped so the reflector knows whether the client can stream the initial list
		// (WatchList); clients that cannot, such as the fake one of tests, are listed instead.
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				narrow(&o)
				return pods.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				narrow(&o)
				return pods.Watch(ctx, o)
			},
		}, k.opts.Client),
		ObjectType: &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { poke() },
			UpdateFunc: func(any, any) { poke() },
			DeleteFunc: func(any) { poke() },
		},
		Transform: slimPod,
	})
	// client-go logs through klog; route what it says about this watch (a list that is
	// forbidden, a watch that failed) to the router's logger.
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(k.opts.Log.With("discovery", k.Name()).Handler()))
	go informer.RunWithContext(ctx)
	select {
	case <-informer.HasSyncedChecker().Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	k.opts.Log.Info("discovery: pods listed", "namespace", k.opts.Namespace, "selector", k.selector.String())
	var last []Endpoint
	report := func() {
		set := k.endpoints(store.List())
		if last != nil && Equal(set, last) {
			return
		}
		last = set
		update(set)
	}
	report()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			report()
		}
	}
}

// endpoints turns the stored pods into the wanted set. The selector is applied here too: the
// API server applies it to the list and watch already, and checking again costs nothing.
func (k *Kubernetes) endpoints(objs []any) []Endpoint {
	eps := make([]Endpoint, 0, len(objs))
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Namespace != k.opts.Namespace || !k.selector.Matches(labels.Set(p.Labels)) {
			continue
		}
		if e, ok := PodEndpoint(p, k.opts.Port); ok {
			eps = append(eps, e)
		}
	}
	return normalize(eps)
}

// PodEndpoint is the worker a pod stands for, on port: none while the pod has no IP or once it
// has finished; draining while it is not Ready or is being deleted.
func PodEndpoint(p *corev1.Pod, port int) (Endpoint, bool) {
	if p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return Endpoint{}, false
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	return Endpoint{
		URL:   "http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)),
		Ready: ready && p.DeletionTimestamp == nil,
		Name:  p.Namespace + "/" + p.Name,
	}, true
}

// slimPod keeps only what PodEndpoint and the selector read, so the informer's cache holds a
// few hundred bytes per pod rather than whole pod specs.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              p.Name,
			Namespace:         p.Namespace,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            p.Labels,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			slim.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return slim, nil
}

// NewClient connects to the API server with kubeconfig, or with the pod's service account when
// kubeconfig is empty.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("not running in a cluster (%w); give --kubeconfig", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, err
	}
	cfg.UserAgent = "cacheroute"
	return kubernetes.NewForConfig(cfg)
}

// serviceAccountNamespace is where a pod's service account names the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// DefaultNamespace is the namespace of the pod the router runs in, from its service account, or
// "default" outside a pod.
func DefaultNamespace() string { return namespaceFrom(serviceAccountNamespace) }

func namespaceFrom(file string) string {
	if b, err := os.ReadFile(file); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}
