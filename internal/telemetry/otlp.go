package telemetry

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

// The router exports OTLP over HTTP only. Collectors serve OTLP/HTTP on port 4318 and OTLP/gRPC
// on port 4317 by convention, so an endpoint on 4317 almost surely names a gRPC listener, which
// would refuse every export; it is refused at start-up instead, with the port to use.
const (
	otlpHTTPPort = "4318"
	otlpGRPCPort = "4317"
)

// CheckEndpoint reports whether endpoint is an OTLP/HTTP URL the router can export spans to:
// http:// or https://, a host, and not the OTLP/gRPC port. Its errors start with the endpoint
// and say what to give instead.
func CheckEndpoint(endpoint string) error {
	if host, _, err := net.SplitHostPort(endpoint); err == nil && !strings.Contains(endpoint, "://") {
		return fmt.Errorf("%q: a host:port is the vLLM router's form, which exports OTLP over gRPC, and traces are exported over OTLP/HTTP only; give the collector's OTLP/HTTP URL: http://%s", endpoint, net.JoinHostPort(host, otlpHTTPPort))
	}
	u, err := url.Parse(endpoint)
	switch {
	case err == nil && (u.Scheme == "grpc" || u.Scheme == "grpcs"):
		return fmt.Errorf("%q: OTLP over gRPC is not supported; export OTLP over HTTP to the collector's OTLP/HTTP port: http(s)://host:%s", endpoint, otlpHTTPPort)
	case err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("%q: want http(s)://host:port[/path] (OTLP over HTTP)", endpoint)
	case u.Port() == otlpGRPCPort:
		return fmt.Errorf("%q: port %s is the OTLP/gRPC port, and traces are exported over OTLP/HTTP only; use the collector's OTLP/HTTP port (%s by convention)", endpoint, otlpGRPCPort, otlpHTTPPort)
	}
	return nil
}

// checkEnvironment refuses OTEL_EXPORTER_OTLP_* variables that ask for OTLP over gRPC, by
// protocol or by endpoint, rather than sending OTLP/HTTP where no OTLP/HTTP receiver listens.
// The traces' own variable overrides the general one, as the SDK reads them.
func checkEnvironment() error {
	switch name, v := firstSet("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); v {
	case "", "http/protobuf", "http/json":
	case "grpc":
		return fmt.Errorf("%s=grpc: traces are exported over OTLP/HTTP only; set http/protobuf (or leave it unset) and point the endpoint at the collector's OTLP/HTTP port (%s by convention)", name, otlpHTTPPort)
	default:
		return fmt.Errorf("%s=%s: want http/protobuf or http/json", name, v)
	}
	if name, v := firstSet("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"); v != "" {
		if err := CheckEndpoint(v); err != nil {
			return fmt.Errorf("%s %w", name, err)
		}
	}
	return nil
}

// firstSet returns the first of the environment variables names that is set, and its value.
func firstSet(names ...string) (name, value string) {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return n, v
		}
	}
	return "", ""
}
