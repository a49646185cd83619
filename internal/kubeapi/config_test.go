package kubeapi_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/kubeapi/kubetest"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

var vllm, _ = kubeapi.ParseSelector("app=vllm")

// kubeconfig writes a kubeconfig whose current context is cluster "c" (with clusterFields) and
// user "u" (with userFields), and returns its path.
func kubeconfig(t *testing.T, dir, server, clusterFields, userFields string) string {
	t.Helper()
	doc := "apiVersion: v1\nkind: Config\ncurrent-context: ctx\ncontexts:\n" +
		"- name: other\n  context: {cluster: nowhere, user: nobody}\n" +
		"- name: ctx\n  context:\n    cluster: c\n    user: u\n    namespace: ignored\n" +
		"clusters:\n- name: c\n  cluster:\n    server: " + server + "\n" + indent(clusterFields, "    ") +
		"users:\n- name: u\n  user:\n" + indent(userFields, "    ")
	path := filepath.Join(dir, "config")
	write(t, path, doc)
	return path
}

func indent(fields, by string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimSpace(fields), "\n") {
		if line != "" {
			b.WriteString(by + line + "\n")
		}
	}
	return b.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil { // replaced whole, as a Secret volume does
		t.Fatal(err)
	}
}

func list(t *testing.T, cfg kubeapi.Config) error {
	t.Helper()
	c, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListPods(context.Background(), "llm", vllm, "")
	return err
}

func lastAuthorization(s *kubetest.Server) string {
	rs := s.Requests()
	if len(rs) == 0 {
		return ""
	}
	return rs[len(rs)-1].Authorization
}

func TestKubeconfigWithTokenAndCertificateAuthorityData(t *testing.T) {
	s := kubetest.NewTLS(t, nil)
	s.SetToken("abc")
	ca := base64.StdEncoding.EncodeToString(s.CertificatePEM())
	cfg, err := kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), s.URL, "certificate-authority-data: "+ca, "token: abc"))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(t, cfg); err != nil || lastAuthorization(s) != "Bearer abc" {
		t.Fatalf("list: %v, authorization %q", err, lastAuthorization(s))
	}
}

// Files a kubeconfig names are relative to its directory, and a tokenFile that is replaced is
// read again.
func TestKubeconfigFilesAreRelativeToItAndTheTokenFileIsReadAgain(t *testing.T) {
	s := kubetest.NewTLS(t, nil)
	s.SetToken("first")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "ca.crt"), string(s.CertificatePEM()))
	write(t, filepath.Join(dir, "token"), "first\n")
	path := kubeconfig(t, dir, s.URL, "certificate-authority: ca.crt", "tokenFile: token")
	t.Chdir(t.TempDir()) // not where the kubeconfig is
	cfg, err := kubeapi.LoadKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListPods(context.Background(), "llm", vllm, ""); err != nil {
		t.Fatal(err)
	}
	s.SetToken("second-token")
	write(t, filepath.Join(dir, "token"), "second-token\n")
	if _, err := c.ListPods(context.Background(), "llm", vllm, ""); err != nil || lastAuthorization(s) != "Bearer second-token" {
		t.Fatalf("after the token file was replaced: %v, authorization %q", err, lastAuthorization(s))
	}
}

func TestKubeconfigClientCertificate(t *testing.T) {
	clusterCA := testkit.NewCA(t, "test cluster CA")
	s := kubetest.NewTLS(t, func(c *tls.Config) { c.ClientCAs, c.ClientAuth = clusterCA.Pool(), tls.RequireAndVerifyClientCert })
	leaf := clusterCA.Issue(t, 2, true)
	kder, err := x509.MarshalECPrivateKey(leaf.Key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := leaf.CertPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}) // SEC 1, as kubeconfigs hold keys
	ca := base64.StdEncoding.EncodeToString(s.CertificatePEM())
	b64 := base64.StdEncoding.EncodeToString
	cfg, err := kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), s.URL, "certificate-authority-data: "+ca,
		"client-certificate-data: "+b64(certPEM)+"\nclient-key-data: "+b64(keyPEM)))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(t, cfg); err != nil {
		t.Fatalf("with the client certificate: %v", err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "tls.crt"), string(certPEM))
	write(t, filepath.Join(dir, "tls.key"), string(keyPEM))
	if cfg, err = kubeapi.LoadKubeconfig(kubeconfig(t, dir, s.URL, "certificate-authority-data: "+ca,
		"client-certificate: tls.crt\nclient-key: tls.key")); err != nil {
		t.Fatal(err)
	}
	if err := list(t, cfg); err != nil {
		t.Fatalf("with the client certificate from files: %v", err)
	}
	if cfg, err = kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), s.URL, "certificate-authority-data: "+ca, "token: x")); err != nil {
		t.Fatal(err)
	}
	if err := list(t, cfg); err == nil {
		t.Fatal("a server that wants a client certificate took a request without one")
	}
}

func TestKubeconfigInsecureSkipTLSVerify(t *testing.T) {
	s := kubetest.NewTLS(t, nil)
	cfg, err := kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), s.URL, "insecure-skip-tls-verify: true", "token: x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := list(t, cfg); err != nil {
		t.Fatalf("insecure-skip-tls-verify: %v", err)
	}
	if cfg, err = kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), s.URL, "", "token: x")); err != nil {
		t.Fatal(err)
	}
	var unknown x509.UnknownAuthorityError
	if err := list(t, cfg); !errors.As(err, &unknown) {
		t.Fatalf("without the cluster's CA: %v, want an unknown authority", err)
	}
}

func TestKubeconfigRefusesWhatItDoesNotImplementByName(t *testing.T) {
	for user, want := range map[string]string{
		"exec:\n  apiVersion: client.authentication.k8s.io/v1\n  command: aws": "exec credential plugins are not supported",
		"auth-provider:\n  name: gcp":                                          "auth-provider plugins are not supported",
		"token: x\nas: admin":                                                  "impersonation",
		"client-certificate-data: eA==":                                        "both its certificate and its key",
	} {
		_, err := kubeapi.LoadKubeconfig(kubeconfig(t, t.TempDir(), "https://127.0.0.1:6443", "", user))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("user %q: %v, want %q", user, err, want)
		}
	}
	dir := t.TempDir()
	for doc, want := range map[string]string{
		"clusters: []":          "no current-context",
		"current-context: gone": `current-context "gone" is not among its contexts`,
		"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'ftp://x'}}]":                "not an http(s) URL",
		"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]":                                                                     `cluster "c" of context "a" is not among its clusters`,
		"current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]": `user "u" of context "a" is not among its users`,
		"{": "kubeconfig",
	} {
		path := filepath.Join(dir, "config")
		write(t, path, doc)
		if _, err := kubeapi.LoadKubeconfig(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", doc, err, want)
		}
	}
}

func TestInClusterNeedsTheServiceEnvironmentAndTheServiceAccount(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if _, err := kubeapi.InClusterFrom(dir, getenv); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Fatalf("without the environment: %v", err)
	}
	env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = "127.0.0.1", "6443"
	if _, err := kubeapi.InClusterFrom(dir, getenv); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("without a token: %v", err)
	}
	write(t, filepath.Join(dir, "token"), "t")
	if _, err := kubeapi.InClusterFrom(dir, getenv); err == nil || !strings.Contains(err.Error(), "certificate authority") {
		t.Fatalf("without ca.crt: %v", err)
	}
}

// A refusal carries the API server's own message; a version too old to watch from is told apart.
func TestRefusalsCarryTheServersMessage(t *testing.T) {
	s := kubetest.New(t)
	s.RefuseLists(&kubeapi.Status{Code: 403, Reason: "Forbidden", Message: `pods is forbidden: cannot list resource "pods"`})
	err := list(t, kubeapi.Config{Server: s.URL})
	var se *kubeapi.StatusError
	if !errors.As(err, &se) || se.Status.Code != 403 || !strings.Contains(err.Error(), `cannot list resource "pods"`) || kubeapi.IsGone(err) {
		t.Fatalf("refused list: %v", err)
	}
	s.Create(kubetest.Pod("llm", "p", "10.0.0.1", true, "app", "vllm"))
	s.Compact()
	c, _ := kubeapi.New(kubeapi.Config{Server: s.URL})
	if _, err := c.WatchPods(context.Background(), "llm", vllm, "100", time.Minute); !kubeapi.IsGone(err) {
		t.Fatalf("a watch from a compacted version: %v, want 410 Gone", err)
	}
}
