package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
)

// The values files the chart is rendered with besides its defaults.
const (
	productionValues = "testdata/values-production.yaml" // every optional part on
	staticValues     = "testdata/values-static.yaml"     // no discovery, no Redis, one replica
)

func TestChartLints(t *testing.T) {
	for _, values := range [][]string{nil, {productionValues}, {staticValues}} {
		args := []string{"lint", "--strict", chartDir, "--namespace", "llm", "--kube-version", kubeVersion}
		for _, f := range values {
			args = append(args, "--values", f)
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("helm lint %v: %v\n%s", values, err, out)
		}
	}
}

// TestStrictDecodingRejectsUnknownFields guards the guard: a misspelt or misplaced field must fail
// the decode, not vanish.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {selektor: {a: b}}\n",
		"misplaced":     "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {readinessProbe: {}}}}\n",
		"duplicate":     "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: x}\ndata: {b: y}\n",
		"wrong type":    "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: {port: 80}}\n",
		"unknown kind":  "apiVersion: v1\nkind: Servise\nmetadata: {name: s}\n",
		"monitor field": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\nspec: {endpoints: [{port: m, intervall: 10s}]}\n",
	} {
		if _, err := decodeManifests(doc); err == nil {
			t.Errorf("%s: decoded without an error:\n%s", name, doc)
		}
	}
}

// TestChartDefaults renders the default values: discovery of the pods labelled app=vllm in the
// release's namespace, two replicas sharing a bundled Redis.
func TestChartDefaults(t *testing.T) {
	r := renderChart(t, nil)
	wantKinds(t, r, map[string]int{
		"ConfigMap": 1, "Deployment": 1, "Service": 2, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
		"PodDisruptionBudget": 1, "StatefulSet": 1, "NetworkPolicy": 1,
	})
	dep := one[*appsv1.Deployment](r)
	pod := dep.Spec.Template.Spec
	c := routerContainer(t, dep)
	checkCommon(t, r, dep)

	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas = %d, want 2", *dep.Spec.Replicas)
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Error("discovery needs the service account token mounted")
	}
	checkProbe(t, "readiness", c.ReadinessProbe, "/readiness", corev1.URISchemeHTTP)
	checkProbe(t, "liveness", c.LivenessProbe, "/liveness", corev1.URISchemeHTTP)
	if _, ok := dep.Spec.Template.Annotations["prometheus.io/scrape"]; !ok {
		t.Error("no prometheus.io/scrape annotation on the pods")
	}
	if got := pdbOf(t, r).Spec.MaxUnavailable; got == nil || got.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", got)
	}
	for _, e := range c.Env {
		if e.Name == config.AdminAPIKeyEnv || e.Name == config.APIKeyEnv {
			t.Errorf("%s set without its Secret being asked for", e.Name)
		}
	}

	checkDiscoveryRBAC(t, r, dep, "llm")

	// The bundled Redis: the router's URL names its pod through its headless Service, and only
	// router pods may reach it.
	sts := one[*appsv1.StatefulSet](r)
	redisSvc := named[*corev1.Service](r, sts.Spec.ServiceName)
	if redisSvc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s must be headless for the pod name %s-0.%s", redisSvc.Name, sts.Name, redisSvc.Name)
	}
	wantSelects(t, "Service "+redisSvc.Name, redisSvc.Spec.Selector, sts.Spec.Template.Labels)
	url := envValue(t, c, config.RedisURLEnv)
	if want := "redis://" + sts.Name + "-0." + redisSvc.Name + ".llm.svc:6379/0"; url != want {
		t.Errorf("%s = %q, want %q", config.RedisURLEnv, url, want)
	}
	checkContainerSecurity(t, "redis", sts.Spec.Template.Spec, sts.Spec.Template.Spec.Containers[0])
	np := one[*networkingv1.NetworkPolicy](r)
	wantSelects(t, "NetworkPolicy podSelector", np.Spec.PodSelector.MatchLabels, sts.Spec.Template.Labels)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil {
		t.Fatalf("NetworkPolicy ingress = %+v, want one rule from the router pods", np.Spec.Ingress)
	}
	wantSelects(t, "NetworkPolicy ingress", np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, dep.Spec.Template.Labels)

	cfg := routerConfig(t, r, dep)
	if !cfg.ServiceDiscovery || !slices.Equal(cfg.Selector, []string{"app=vllm"}) || cfg.ServiceDiscoveryPort != 8000 || cfg.ServiceDiscoveryNamespace != "llm" {
		t.Errorf("discovery = %v %v port %d namespace %q, want app=vllm on port 8000 in llm",
			cfg.ServiceDiscovery, cfg.Selector, cfg.ServiceDiscoveryPort, cfg.ServiceDiscoveryNamespace)
	}
	if cfg.SessionStore != "redis" || cfg.AdminAPIKey != "" || cfg.ClientAPIKeysFile != "" || cfg.TLSCertFile != "" {
		t.Errorf("store %q, admin key %q, client keys %q, TLS %q: want redis and no keys or TLS",
			cfg.SessionStore, cfg.AdminAPIKey, cfg.ClientAPIKeysFile, cfg.TLSCertFile)
	}

	// The chart's defaults are the router's: a router default changed without the chart would
	// otherwise be overridden by a stale copy in every Helm install.
	def := config.Default()
	for _, k := range []struct {
		name      string
		got, want any
	}{
		{"policy.name", cfg.Policy, def.Policy},
		{"policy.cacheThreshold", cacheaware.KnobsIn(cfg.PolicyOptions).CacheThreshold, cacheaware.KnobsIn(def.PolicyOptions).CacheThreshold},
		{"policy.balanceAbsThreshold", cacheaware.KnobsIn(cfg.PolicyOptions).BalanceAbsThreshold, cacheaware.KnobsIn(def.PolicyOptions).BalanceAbsThreshold},
		{"policy.balanceRelThreshold", cacheaware.KnobsIn(cfg.PolicyOptions).BalanceRelThreshold, cacheaware.KnobsIn(def.PolicyOptions).BalanceRelThreshold},
		{"policy.maxTreeSize", cacheaware.KnobsIn(cfg.PolicyOptions).MaxTreeSize, cacheaware.KnobsIn(def.PolicyOptions).MaxTreeSize},
		{"policy.evictionIntervalSecs", cacheaware.KnobsIn(cfg.PolicyOptions).EvictionIntervalSecs, cacheaware.KnobsIn(def.PolicyOptions).EvictionIntervalSecs},
		{"policy.sessionTtl", cfg.SessionTTL, def.SessionTTL},
		{"policy.maxSessions", cfg.MaxSessions, def.MaxSessions},
		{"dataParallelSize", cfg.DPSize, def.DPSize},
		{"discovery.port", cfg.ServiceDiscoveryPort, def.ServiceDiscoveryPort},
		{"sessionStore.keyPrefix", cfg.RedisKeyPrefix, def.RedisKeyPrefix},
		{"sessionStore.timeout", cfg.RedisTimeout, def.RedisTimeout},
		{"config.shutdown_grace_secs", cfg.ShutdownGraceSecs, def.ShutdownGraceSecs},
	} {
		if k.got != k.want {
			t.Errorf("chart default %s = %v, the router's is %v", k.name, k.got, k.want)
		}
	}
}

// TestChartProduction renders every optional part with values other than the defaults.
func TestChartProduction(t *testing.T) {
	r := renderChart(t, []string{productionValues})
	wantKinds(t, r, map[string]int{
		"ConfigMap": 1, "Deployment": 1, "Service": 3, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
		"PodDisruptionBudget": 1, "ServiceMonitor": 1,
	})
	dep := one[*appsv1.Deployment](r)
	c := routerContainer(t, dep)
	checkCommon(t, r, dep)

	if *dep.Spec.Replicas != 3 || c.Image != "registry.example.com/llm/cacheroute:v0.1.0" {
		t.Errorf("replicas %d image %q", *dep.Spec.Replicas, c.Image)
	}
	// TLS: the probes speak HTTPS, the ServiceMonitor too.
	checkProbe(t, "readiness", c.ReadinessProbe, "/readiness", corev1.URISchemeHTTPS)
	checkProbe(t, "liveness", c.LivenessProbe, "/liveness", corev1.URISchemeHTTPS)
	if c.ReadinessProbe.PeriodSeconds != 3 || c.LivenessProbe.FailureThreshold != 5 {
		t.Errorf("probe timings not taken from the values: %+v %+v", c.ReadinessProbe, c.LivenessProbe)
	}
	if _, ok := dep.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
		t.Error("podMetricsAnnotations: false still annotates the pods")
	}
	if got := pdbOf(t, r).Spec.MinAvailable; got == nil || got.IntValue() != 2 || pdbOf(t, r).Spec.MaxUnavailable != nil {
		t.Errorf("PodDisruptionBudget minAvailable = %v, want 2 and no maxUnavailable", got)
	}

	// The admin key comes from the named Secret, which must exist: the reference is not optional.
	checkSecretEnv(t, c, config.AdminAPIKeyEnv, "router-admin", "token")
	checkSecretEnv(t, c, config.APIKeyEnv, "vllm-key", "key")
	checkSecretEnv(t, c, config.RedisURLEnv, "router-redis", "redis-url")

	checkDiscoveryRBAC(t, r, dep, "inference")
	if dep.Spec.Template.Spec.ServiceAccountName != "llm-router" {
		t.Errorf("serviceAccountName = %q, want llm-router", dep.Spec.Template.Spec.ServiceAccountName)
	}

	// A controller reaches every replica's admin API through the headless replicas Service.
	replicas := named[*corev1.Service](r, "router-replicas")
	if replicas.Spec.ClusterIP != corev1.ClusterIPNone || !replicas.Spec.PublishNotReadyAddresses {
		t.Error("router-replicas must be headless and list replicas that are not ready")
	}
	wantSelects(t, "Service router-replicas", replicas.Spec.Selector, dep.Spec.Template.Labels)
	client := named[*corev1.Service](r, "router")
	if client.Spec.Type != corev1.ServiceTypeLoadBalancer || client.Spec.Ports[0].Port != 443 {
		t.Errorf("client Service %s port %d", client.Spec.Type, client.Spec.Ports[0].Port)
	}

	// The ServiceMonitor selects the metrics Service, whose port it names.
	sm := one[*serviceMonitor](r)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	var metricsSvc *corev1.Service
	for _, s := range all[*corev1.Service](r) {
		if sel.Matches(labels.Set(s.Labels)) {
			if metricsSvc != nil {
				t.Fatalf("the ServiceMonitor selects both %s and %s", metricsSvc.Name, s.Name)
			}
			metricsSvc = s
		}
	}
	if metricsSvc == nil {
		t.Fatal("the ServiceMonitor selects no Service")
	}
	wantSelects(t, "Service "+metricsSvc.Name, metricsSvc.Spec.Selector, dep.Spec.Template.Labels)
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints = %d, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if !slices.ContainsFunc(metricsSvc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Name == ep.Port && p.TargetPort.StrVal == "metrics"
	}) {
		t.Errorf("ServiceMonitor port %q is not the metrics port of Service %s", ep.Port, metricsSvc.Name)
	}
	if ep.Scheme != "https" || ep.TLSConfig == nil || ep.Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %+v, want https with a tlsConfig on /metrics", ep)
	}
	for _, d := range []string{ep.Interval, ep.ScrapeTimeout} {
		if _, err := model.ParseDuration(d); err != nil {
			t.Errorf("ServiceMonitor duration %q: %v", d, err)
		}
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"llm"}) || sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor namespaces %v labels %v", sm.Spec.NamespaceSelector.MatchNames, sm.Labels)
	}

	cfg := routerConfig(t, r, dep)
	if !slices.Equal(cfg.Selector, []string{"app.kubernetes.io/name=vllm", "model=llama-3-70b"}) ||
		cfg.ServiceDiscoveryPort != 8080 || cfg.ServiceDiscoveryNamespace != "inference" {
		t.Errorf("discovery %v port %d namespace %q", cfg.Selector, cfg.ServiceDiscoveryPort, cfg.ServiceDiscoveryNamespace)
	}
	if cacheaware.KnobsIn(cfg.PolicyOptions).CacheThreshold != 0.5 || cacheaware.KnobsIn(cfg.PolicyOptions).BalanceAbsThreshold != 32 || cfg.SessionTTL.Minutes() != 30 || cfg.DPSize != 2 ||
		cfg.RedisKeyPrefix != "prod-router" || cfg.RequestTimeoutSecs != 600 || cfg.PriorityReserve != 16 {
		t.Errorf("policy and config values not passed through: %+v", cfg)
	}
	if cfg.ClientAPIKeysFile == "" || cfg.TLSCertFile == "" || cfg.TLSKeyFile == "" || cfg.WorkerCAFile == "" {
		t.Errorf("client keys %q, TLS %q %q, worker CA %q: want all set", cfg.ClientAPIKeysFile, cfg.TLSCertFile, cfg.TLSKeyFile, cfg.WorkerCAFile)
	}
	if grace := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; grace == nil || float64(*grace) < cfg.ShutdownGraceSecs+5 {
		t.Errorf("terminationGracePeriodSeconds %v does not cover shutdown_grace_secs %v and the preStop pause", grace, cfg.ShutdownGraceSecs)
	}
}

// TestChartStatic renders a router without discovery: no RBAC, no token, no Redis.
func TestChartStatic(t *testing.T) {
	r := renderChart(t, []string{staticValues})
	wantKinds(t, r, map[string]int{"ConfigMap": 1, "Deployment": 1, "Service": 1})
	dep := one[*appsv1.Deployment](r)
	pod := dep.Spec.Template.Spec
	c := routerContainer(t, dep)
	checkCommon(t, r, dep)
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("without discovery the pod must not get a service account token")
	}
	if pod.ServiceAccountName != "default" {
		t.Errorf("serviceAccountName = %q, want default (serviceAccount.create false)", pod.ServiceAccountName)
	}
	if len(c.Env) != 0 {
		t.Errorf("env = %+v, want none", c.Env)
	}
	cfg := routerConfig(t, r, dep)
	if cfg.ServiceDiscovery || cfg.SessionStore != "memory" || cfg.Policy != "power_of_two" ||
		!slices.Equal(cfg.WorkerURLs, []string{"http://vllm-0.vllm:8000", "http://vllm-1.vllm:8000"}) {
		t.Errorf("config %+v", cfg)
	}
}

// TestChartRefuses checks the values the chart will not render, each with a message that says
// what to do.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []string
		want string
	}{
		{"admin API without its Secret", []string{"admin.enabled=true"}, "admin.enabled needs admin.existingSecret"},
		{"discovery without a selector", []string{"discovery.selector=null"}, "discovery.selector must name at least one label"},
		{"no worker source", []string{"discovery.enabled=false"}, "no workers"},
		{"a secret in config", []string{"config.admin_api_key=hunter2"}, "config.admin_api_key is set by the chart"},
		{"a chart-managed key in config", []string{"config.port=8080"}, "config.port is set by the chart"},
		{"a misspelt value", []string{"sessionStore.tpye=redis"}, "tpye"},
		{"an unknown store", []string{"sessionStore.type=etcd"}, "sessionStore"},
		{"an unknown policy", []string{"policy.name=fastest"}, "policy"},
		{"a malformed selector", []string{"discovery.selector={app}"}, "selector"},
	} {
		out, err := render(t, nil, tc.sets...)
		if err == nil {
			t.Errorf("%s: rendered:\n%s", tc.name, out)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not say %q", tc.name, err, tc.want)
		}
	}
}

func wantKinds(t *testing.T, r *rendered, want map[string]int) {
	t.Helper()
	got := r.kinds()
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%d %s rendered, want %d", got[k], k, n)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s rendered", k)
		}
	}
	for _, m := range r.objs {
		if m.Kind == "ClusterRole" || m.Kind == "ClusterRoleBinding" {
			t.Errorf("%s %s: the router needs no cluster-wide permission", m.Kind, m.Name)
		}
	}
}

// checkCommon checks what holds for every rendering: the Services, the PodDisruptionBudget and the
// ServiceMonitor select the router pods, ports are named as the probes and Services use them, the
// pod runs as in deploy/Dockerfile without privileges, and a preStop pause precedes the drain.
func checkCommon(t *testing.T, r *rendered, dep *appsv1.Deployment) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	c := routerContainer(t, dep)
	wantSelects(t, "Deployment selector", dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
	checkContainerSecurity(t, "cacheroute", pod, c)
	if pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser != 65532 {
		t.Error("the router runs as uid 65532, the distroless nonroot user")
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 30000 || ports["metrics"] != 29000 {
		t.Errorf("container ports %v, want http 30000 and metrics 29000", ports)
	}
	for _, s := range all[*corev1.Service](r) {
		if s.Spec.Selector["app.kubernetes.io/component"] != "router" {
			continue
		}
		wantSelects(t, "Service "+s.Name, s.Spec.Selector, dep.Spec.Template.Labels)
		for _, p := range s.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s targets port %q, which the container does not name", s.Name, p.TargetPort.String())
			}
		}
	}
	for _, pdb := range all[*policyv1.PodDisruptionBudget](r) {
		wantSelects(t, "PodDisruptionBudget", pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
		t.Error("no preStop sleep: the Service would still send requests to a draining replica")
	}
	if dep.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a changed router.yaml would not roll the replicas")
	}
	if s := dep.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Error("a rollout must not take a ready replica away before its successor is ready")
	}
	for _, m := range r.objs {
		if m.Namespace == "" {
			t.Errorf("%s %s has no namespace", m.Kind, m.Name)
		}
		if _, ok := m.Object.(*corev1.Secret); ok {
			t.Errorf("the chart renders Secret %s: secrets come from Secrets the operator creates", m.Name)
		}
	}
}

func checkContainerSecurity(t *testing.T, name string, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	ps := pod.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod securityContext %+v, want runAsNonRoot and the RuntimeDefault seccomp profile", name, ps)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("%s: container securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", name, sc)
	}
}

func checkProbe(t *testing.T, name string, p *corev1.Probe, path string, scheme corev1.URIScheme) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Fatalf("%s probe: want an HTTP GET", name)
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.StrVal != "http" || p.HTTPGet.Scheme != scheme {
		t.Errorf("%s probe: GET %s %s on port %s, want %s %s on http", name, p.HTTPGet.Scheme, p.HTTPGet.Path, p.HTTPGet.Port.String(), scheme, path)
	}
}

// checkDiscoveryRBAC checks the least privilege of discovery: one Role in the watched namespace
// allowing exactly get, list and watch on pods, bound to the router's service account only.
func checkDiscoveryRBAC(t *testing.T, r *rendered, dep *appsv1.Deployment, namespace string) {
	t.Helper()
	role := one[*rbacv1.Role](r)
	if role.Namespace != namespace {
		t.Errorf("Role in %q, want the discovery namespace %q", role.Namespace, namespace)
	}
	if len(role.Rules) != 1 {
		t.Fatalf("Role rules = %+v, want one", role.Rules)
	}
	rule := role.Rules[0]
	verbs := slices.Sorted(slices.Values(rule.Verbs))
	if !slices.Equal(rule.APIGroups, []string{""}) || !slices.Equal(rule.Resources, []string{"pods"}) ||
		!slices.Equal(verbs, []string{"get", "list", "watch"}) || len(rule.ResourceNames) != 0 || len(rule.NonResourceURLs) != 0 {
		t.Errorf("Role rule %+v, want exactly get, list, watch on core pods", rule)
	}
	rb := one[*rbacv1.RoleBinding](r)
	if rb.Namespace != namespace || rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || rb.RoleRef.APIGroup != rbacv1.GroupName {
		t.Errorf("RoleBinding %s/%s refers to %+v, want Role %s", rb.Namespace, rb.Name, rb.RoleRef, role.Name)
	}
	want := rbacv1.Subject{Kind: "ServiceAccount", Name: dep.Spec.Template.Spec.ServiceAccountName, Namespace: dep.Namespace}
	if len(rb.Subjects) != 1 || rb.Subjects[0] != want {
		t.Errorf("RoleBinding subjects %+v, want only %+v", rb.Subjects, want)
	}
	sa := named[*corev1.ServiceAccount](r, want.Name)
	if sa.Namespace != dep.Namespace {
		t.Errorf("ServiceAccount in %q, want %q", sa.Namespace, dep.Namespace)
	}
}

func routerContainer(t *testing.T, dep *appsv1.Deployment) corev1.Container {
	t.Helper()
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "cacheroute" {
		t.Fatalf("containers %d, want the one cacheroute container", len(cs))
	}
	return cs[0]
}

func pdbOf(t *testing.T, r *rendered) *policyv1.PodDisruptionBudget {
	t.Helper()
	return one[*policyv1.PodDisruptionBudget](r)
}

func wantSelects(t *testing.T, what string, selector, podLabels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) {
		t.Errorf("%s %v does not select the pods labelled %v", what, selector, podLabels)
	}
}

func envValue(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.ValueFrom != nil {
				t.Fatalf("%s comes from %+v, want a value", name, e.ValueFrom)
			}
			return e.Value
		}
	}
	t.Fatalf("no %s in the environment", name)
	return ""
}

// checkSecretEnv checks that env var name comes from key of Secret secret, and that the reference
// is not optional: without the Secret the pod does not start.
func checkSecretEnv(t *testing.T, c corev1.Container, name, secret, key string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Fatalf("%s = %+v, want a secretKeyRef", name, e)
		}
		ref := e.ValueFrom.SecretKeyRef
		if ref.Optional != nil && *ref.Optional {
			t.Errorf("%s: the Secret reference is optional; the pod must not start without the Secret", name)
		}
		if ref.Name != secret || ref.Key != key {
			t.Errorf("%s from Secret %q key %q, want %q key %q", name, ref.Name, ref.Key, secret, key)
		}
		return
	}
	t.Errorf("no %s in the environment", name)
}

// routerConfig loads the rendered router.yaml the way the router does (strict YAML keys, then
// Validate), with the container's arguments and environment, Secrets replaced by placeholders.
// Every file the configuration names must lie in a volume the container mounts.
func routerConfig(t *testing.T, r *rendered, dep *appsv1.Deployment) config.Config {
	t.Helper()
	c := routerContainer(t, dep)
	if len(c.Args) != 2 || c.Args[0] != "--config" {
		t.Fatalf("args %q, want --config FILE", c.Args)
	}
	file := c.Args[1]
	mount, vol := mountOf(t, dep, c, file)
	if vol.ConfigMap == nil {
		t.Fatalf("%s is not in a ConfigMap volume", file)
	}
	cm := named[*corev1.ConfigMap](r, vol.ConfigMap.Name)
	rel, _ := filepath.Rel(mount.MountPath, file)
	data, ok := cm.Data[rel]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", cm.Name, rel)
	}

	// Every *_file setting must be a file the pod has: under a mount, and among the volume's items
	// when it lists them.
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(data), &raw); err != nil {
		t.Fatalf("router.yaml: %v", err)
	}
	root := t.TempDir()
	for key, v := range raw {
		if !strings.HasSuffix(key, "_file") {
			continue
		}
		path, _ := v.(string)
		m, vol := mountOf(t, dep, c, path)
		name, _ := filepath.Rel(m.MountPath, path)
		var items []corev1.KeyToPath
		switch {
		case vol.Secret != nil:
			items = vol.Secret.Items
		case vol.ConfigMap != nil:
			items = vol.ConfigMap.Items
		}
		if len(items) > 0 && !slices.ContainsFunc(items, func(i corev1.KeyToPath) bool { return i.Path == name }) {
			t.Errorf("%s: %s is not among the items of volume %s", key, path, vol.Name)
		}
		local := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(local, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data = strings.ReplaceAll(data, "/etc/cacheroute/", root+"/etc/cacheroute/")
	cfgFile := filepath.Join(root, "router.yaml")
	if err := os.WriteFile(cfgFile, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, name := range []string{config.RedisURLEnv, config.AdminAPIKeyEnv, config.APIKeyEnv} {
		t.Setenv(name, "")
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.Name == config.RedisURLEnv:
			t.Setenv(e.Name, "rediss://:secret@redis.example.com:6380/0")
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			t.Setenv(e.Name, "from-secret-"+e.ValueFrom.SecretKeyRef.Name)
		case e.ValueFrom == nil:
			t.Setenv(e.Name, e.Value)
		}
	}

	fs := pflag.NewFlagSet("cacheroute", pflag.ContinueOnError)
	flagged := config.Default()
	config.BindFlags(fs, &flagged)
	var configFile string
	fs.StringVar(&configFile, "config", "", "")
	if err := fs.Parse([]string{"--config", cfgFile}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(fs, &flagged, configFile)
	if err != nil {
		t.Fatalf("the router refuses the rendered router.yaml: %v\n%s", err, data)
	}
	if len(cfg.WorkerURLs) == 0 && !cfg.Discovery() {
		t.Errorf("the router would start without a way to find workers:\n%s", data)
	}
	if cfg.Host != "0.0.0.0" || cfg.PrometheusHost != "0.0.0.0" {
		t.Errorf("listening on %s and %s: the Service and the scraper could not reach it", cfg.Host, cfg.PrometheusHost)
	}
	if cfg.Port != 30000 || cfg.PrometheusPort != 29000 {
		t.Errorf("ports %d and %d, the container names 30000 and 29000", cfg.Port, cfg.PrometheusPort)
	}
	return cfg
}

// mountOf returns the container's mount that holds path, and its volume.
func mountOf(t *testing.T, dep *appsv1.Deployment, c corev1.Container, path string) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.SubPath == "" && strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if v.Name == m.Name {
					return m, v
				}
			}
			t.Fatalf("mount %s names no volume", m.Name)
		}
	}
	t.Fatalf("%s is in no volume the container mounts", path)
	return corev1.VolumeMount{}, corev1.Volume{}
}
