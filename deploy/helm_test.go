// Package deploy holds the tests of what deploy/ ships: the Helm chart (linted, rendered with
// default and other values, every manifest decoded strictly into its Kubernetes API type), the
// Grafana dashboard and the Prometheus alert rules (every metric they name is one the router
// exports).
package deploy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	chartDir = "helm/cacheroute"
	// kubeVersion is the oldest Kubernetes the chart supports (Chart.yaml's kubeVersion). A helm
	// built with `go install` assumes v1.20 when it renders without a cluster.
	kubeVersion = "1.30.0"
	helmHint    = "run `make tools` (installs helm into .bin from the Go module proxy), or set HELM to a helm v3 binary"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm finds the helm binary: $HELM (make test sets it), then the repository's .bin/helm (make
// tools), then helm on PATH. Missing, the test fails: the chart is part of what CI checks.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("HELM"); p != "" {
			if _, err := os.Stat(p); err != nil {
				helmErr = errors.New("HELM=" + p + " does not exist: " + helmHint)
				return
			}
			helmPath = p
			return
		}
		if p, err := filepath.Abs(filepath.Join("..", ".bin", "helm")); err == nil {
			if _, err := os.Stat(p); err == nil {
				helmPath = p
				return
			}
		}
		if p, err := exec.LookPath("helm"); err == nil {
			helmPath = p
			return
		}
		helmErr = errors.New("helm not found: " + helmHint)
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

// runHelm runs helm with args and returns its stdout, or its stderr as the error. Helm's own
// state (repositories, cache) goes to a temporary directory, never to the user's home.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := helm(t)
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New(strings.TrimSpace(stderr.String()) + " (" + err.Error() + ")")
	}
	return stdout.String(), nil
}

// render runs helm template for release "rel" in namespace "llm" with the values files and
// --set pairs given.
func render(t *testing.T, valuesFiles []string, sets ...string) (string, error) {
	t.Helper()
	args := []string{"template", "rel", chartDir, "--namespace", "llm", "--kube-version", kubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return runHelm(t, args...)
}
