package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// manifest is one rendered document, decoded.
type manifest struct {
	Source     string // the template it came from, as helm names it
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	Object     any // a k8s.io/api type, or *serviceMonitor
}

// apiScheme knows the k8s.io/api groups the chart renders; a kind of any other group fails to
// decode, so a new one must be added here to be checked.
var apiScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict decodes YAML into the types of k8s.io/api, failing on unknown or duplicate fields (the
// API server would drop the first silently, or reject the manifest).
var strict = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, apiScheme, apiScheme,
	kjson.SerializerOptions{Yaml: true, Strict: true})

// decodeManifests splits helm template's output into documents and decodes each strictly.
func decodeManifests(out string) ([]manifest, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	var all []manifest
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return all, nil
		}
		if err != nil {
			return nil, err
		}
		source := ""
		empty := true
		for line := range strings.SplitSeq(string(doc), "\n") {
			trimmed := strings.TrimSpace(line)
			if s, ok := strings.CutPrefix(trimmed, "# Source: "); ok {
				source = s
			}
			if trimmed != "" && !strings.HasPrefix(trimmed, "#") {
				empty = false
			}
		}
		if empty {
			continue
		}
		m, err := decodeManifest(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		m.Source = source
		all = append(all, m)
	}
}

func decodeManifest(doc []byte) (manifest, error) {
	var meta metav1.PartialObjectMetadata
	if err := utilyaml.Unmarshal(doc, &meta); err != nil {
		return manifest{}, err
	}
	m := manifest{APIVersion: meta.APIVersion, Kind: meta.Kind, Name: meta.Name, Namespace: meta.Namespace}
	if m.APIVersion == "" || m.Kind == "" || m.Name == "" {
		return m, fmt.Errorf("apiVersion, kind and metadata.name are required, got %q %q %q", m.APIVersion, m.Kind, m.Name)
	}
	if m.APIVersion == "monitoring.coreos.com/v1" && m.Kind == "ServiceMonitor" {
		var sm serviceMonitor
		if err := decodeJSONStrict(doc, &sm); err != nil {
			return m, fmt.Errorf("ServiceMonitor %s: %w", m.Name, err)
		}
		m.Object = &sm
		return m, nil
	}
	obj, gvk, err := strict.Decode(doc, nil, nil)
	if err != nil {
		return m, fmt.Errorf("%s %s: %w", m.Kind, m.Name, err)
	}
	if gvk.Kind != m.Kind || gvk.GroupVersion().String() != m.APIVersion {
		return m, fmt.Errorf("%s %s decoded as %v", m.Kind, m.Name, gvk)
	}
	m.Object = obj
	if _, ok := obj.(*runtime.Unknown); ok {
		return m, fmt.Errorf("%s %s: not a known API type", m.Kind, m.Name)
	}
	return m, nil
}

// decodeJSONStrict converts YAML to JSON and decodes it, failing on unknown fields and on
// anything after the object.
func decodeJSONStrict(doc []byte, v any) error {
	j, err := utilyaml.ToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the object")
	}
	return nil
}

// serviceMonitor is the part of the Prometheus Operator's monitoring.coreos.com/v1 ServiceMonitor
// the chart may render; a field outside it is a mistake in the template (or a field to add here
// from the operator's API reference).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			TLSConfig     *struct {
				CA                 json.RawMessage `json:"ca,omitempty"`
				Cert               json.RawMessage `json:"cert,omitempty"`
				KeySecret          json.RawMessage `json:"keySecret,omitempty"`
				CAFile             string          `json:"caFile,omitempty"`
				CertFile           string          `json:"certFile,omitempty"`
				KeyFile            string          `json:"keyFile,omitempty"`
				ServerName         string          `json:"serverName,omitempty"`
				InsecureSkipVerify bool            `json:"insecureSkipVerify,omitempty"`
			} `json:"tlsConfig,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is one rendering of the chart, decoded.
type rendered struct {
	t    *testing.T
	objs []manifest
}

// renderChart renders the chart and decodes every manifest strictly; any failure fails the test.
func renderChart(t *testing.T, valuesFiles []string, sets ...string) *rendered {
	t.Helper()
	out, err := render(t, valuesFiles, sets...)
	if err != nil {
		t.Fatalf("helm template %v %v: %v", valuesFiles, sets, err)
	}
	objs, err := decodeManifests(out)
	if err != nil {
		t.Fatalf("helm template %v %v: %v", valuesFiles, sets, err)
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	return &rendered{t: t, objs: objs}
}

// kinds counts the rendered objects by kind.
func (r *rendered) kinds() map[string]int {
	n := map[string]int{}
	for _, m := range r.objs {
		n[m.Kind]++
	}
	return n
}

// all returns the objects of type T.
func all[T any](r *rendered) []T {
	var out []T
	for _, m := range r.objs {
		if o, ok := m.Object.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

// one returns the only object of type T, failing the test when there is not exactly one.
func one[T any](r *rendered) T {
	r.t.Helper()
	objs := all[T](r)
	if len(objs) != 1 {
		var zero T
		r.t.Fatalf("want exactly one %T, got %d", zero, len(objs))
	}
	return objs[0]
}

// named returns the object of type T with the given name.
func named[T interface{ GetName() string }](r *rendered, name string) T {
	r.t.Helper()
	for _, o := range all[T](r) {
		if o.GetName() == name {
			return o
		}
	}
	var zero T
	r.t.Fatalf("no %T named %q", zero, name)
	return zero
}
