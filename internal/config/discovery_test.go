package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/config"
)

// loadSelector parses args with --selector expanded from its space-separated form, as the root
// command does.
func loadSelector(t *testing.T, args ...string) (config.Config, error) {
	t.Helper()
	cfg := config.Default()
	fs := pflag.NewFlagSet("cacheroute", pflag.ContinueOnError)
	config.BindFlags(fs, &cfg)
	args = config.ExpandSpaceSeparated(args, "selector", "sim", "bench", "demo")
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	if len(fs.Args()) != 0 {
		t.Fatalf("parse %q left %q", args, fs.Args())
	}
	return config.Load(fs, &cfg, "")
}

func TestServiceDiscoveryWithoutStaticWorkersIsAllowed(t *testing.T) {
	c, err := loadSelector(t, "--service-discovery", "--selector", "app=vllm")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Discovery() || len(c.WorkerURLs) != 0 {
		t.Fatalf("Discovery()=%v workers=%v", c.Discovery(), c.WorkerURLs)
	}
	if c.ServiceDiscoveryPort != 8000 || c.ServiceDiscoveryNamespace != "" || c.Kubeconfig != "" {
		t.Fatalf("defaults: port %d namespace %q kubeconfig %q", c.ServiceDiscoveryPort, c.ServiceDiscoveryNamespace, c.Kubeconfig)
	}
}

func TestDiscoveryReportsEachKind(t *testing.T) {
	c := config.Default()
	if c.Discovery() {
		t.Fatal("default config reports discovery")
	}
	c.DNSDiscovery = "vllm.ns.svc:8000"
	if !c.Discovery() {
		t.Fatal("--dns-discovery not reported")
	}
	c = config.Default()
	c.ServiceDiscovery = true
	if !c.Discovery() {
		t.Fatal("--service-discovery not reported")
	}
}

func TestSelectorForms(t *testing.T) {
	want := []string{"app=vllm", "tier=gpu", "example.com/pool=a"}
	for _, args := range [][]string{
		{"--selector", "app=vllm", "tier=gpu", "example.com/pool=a"},
		{"--selector", "app=vllm,tier=gpu", "--selector", "example.com/pool=a"},
		{"--selector=app=vllm", "--selector", "tier=gpu", "--selector", "example.com/pool=a"},
	} {
		c, err := loadSelector(t, append([]string{"--service-discovery"}, args...)...)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if !reflect.DeepEqual(c.Selector, want) {
			t.Fatalf("%q: selector %q, want %q", args, c.Selector, want)
		}
		if got := c.SelectorString(); got != "app=vllm,tier=gpu,example.com/pool=a" {
			t.Fatalf("SelectorString %q", got)
		}
	}
}

func TestDiscoveryValidation(t *testing.T) {
	long := "app=" + strings.Repeat("a", 64)
	tests := []struct {
		name    string
		set     func(*config.Config)
		wantErr string // "" = valid
	}{
		{"selector with empty value", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"gpu="} }, ""},
		{"selector without =", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"app"} }, "--selector: \"app\": want key=value"},
		{"selector set-based", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"app!=x"} }, "want key=value"},
		{"selector double =", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"app==x"} }, "want key=value"},
		{"selector bad key", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"-app=x"} }, "is not a label key"},
		{"selector bad prefix", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"Example.com/app=x"} }, "is not a DNS subdomain"},
		{"selector bad value", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{"app=a b"} }, "is not a label value"},
		{"selector long value", func(c *config.Config) { c.ServiceDiscovery, c.Selector = true, []string{long} }, "is not a label value"},
		{"discovery without selector", func(c *config.Config) { c.ServiceDiscovery = true }, "--selector: required with --service-discovery"},
		{"selector without discovery", func(c *config.Config) { c.Selector = []string{"app=vllm"} }, "--selector: has no effect without --service-discovery"},
		{"port 0", func(c *config.Config) { c.ServiceDiscoveryPort = 0 }, "--service-discovery-port: 0 is not a port number"},
		{"port too big", func(c *config.Config) { c.ServiceDiscoveryPort = 65536 }, "--service-discovery-port: 65536"},
		{"namespace upper case", func(c *config.Config) { c.ServiceDiscoveryNamespace = "Prod" }, "--service-discovery-namespace"},
		{"namespace ok", func(c *config.Config) { c.ServiceDiscoveryNamespace = "llm-prod" }, ""},
		{"dns ok", func(c *config.Config) { c.DNSDiscovery = "vllm-headless.llm.svc.cluster.local:8000" }, ""},
		{"dns ipv6 literal ok", func(c *config.Config) { c.DNSDiscovery = "[::1]:8000" }, ""},
		{"dns no port", func(c *config.Config) { c.DNSDiscovery = "vllm-headless" }, "--dns-discovery: want NAME:PORT"},
		{"dns empty name", func(c *config.Config) { c.DNSDiscovery = ":8000" }, "--dns-discovery: want NAME:PORT, the name is empty"},
		{"dns bad port", func(c *config.Config) { c.DNSDiscovery = "vllm:http" }, "--dns-discovery: \"http\" is not a port number"},
		{"dns port 0", func(c *config.Config) { c.DNSDiscovery = "vllm:0" }, "is not a port number"},
		{"dns refresh 0", func(c *config.Config) { c.DNSRefreshSecs = 0 }, "--dns-refresh-secs: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config.Default()
			tt.set(&c)
			err := c.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestDNSTargetSplitsNameAndPort(t *testing.T) {
	c := config.Default()
	c.DNSDiscovery = "vllm-headless.llm:8001"
	name, port, err := c.DNSTarget()
	if err != nil || name != "vllm-headless.llm" || port != 8001 {
		t.Fatalf("DNSTarget = %q %d %v", name, port, err)
	}
}

func TestDiscoveryKnobsFromYAML(t *testing.T) {
	c, _, err := load(t, "--config", writeYAML(t, "service_discovery: true\nselector: [app=vllm, tier=gpu]\nservice_discovery_port: 8080\n"+
		"service_discovery_namespace: llm\nkubeconfig: /etc/kube/config\ndns_discovery: vllm.llm:8000\ndns_refresh_secs: 2.5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.ServiceDiscovery || !reflect.DeepEqual(c.Selector, []string{"app=vllm", "tier=gpu"}) || c.ServiceDiscoveryPort != 8080 ||
		c.ServiceDiscoveryNamespace != "llm" || c.Kubeconfig != "/etc/kube/config" || c.DNSDiscovery != "vllm.llm:8000" || c.DNSRefresh().Seconds() != 2.5 {
		t.Fatalf("loaded %+v", c)
	}
}
