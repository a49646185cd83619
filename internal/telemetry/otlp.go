package telemetry

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// The router exports OTLP over HTTP only. Collectors serve OTLP/HTTP on port 4318 and OTLP/gRPC
// on port 4317 by convention, so an endpoint on 4317 almost surely names a gRPC listener, which
// would refuse every export; it is refused at start-up instead, with the port to use.
const (
	otlpHTTPPort = "4318"
	otlpGRPCPort = "4317"
)

// defaultExportTimeout bounds one export, retries included, unless OTEL_EXPORTER_OTLP_TIMEOUT
// says otherwise (the OTLP exporter specification's default).
const defaultExportTimeout = 10 * time.Second

// CheckEndpoint reports whether endpoint is an OTLP/HTTP URL the router can export spans to:
// http:// or https://, a host, and not the OTLP/gRPC port. A host:port with no scheme, the
// vLLM router's form, names an OTLP/gRPC collector there and is refused too. Its errors start
// with the endpoint and say what to give instead.
func CheckEndpoint(endpoint string) error {
	if host, _, err := net.SplitHostPort(endpoint); err == nil && !strings.Contains(endpoint, "://") {
		return fmt.Errorf("%q: a host:port with no scheme names an OTLP/gRPC collector (the vLLM router's form), and traces are exported over OTLP/HTTP only; give the collector's OTLP/HTTP URL: http://%s", endpoint, net.JoinHostPort(host, otlpHTTPPort))
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

// exportSettings say where and how spans are sent.
type exportSettings struct {
	url     string      // the full URL spans are POSTed to
	headers [][2]string // sent with every export
	timeout time.Duration
	gzip    bool
	tls     *tls.Config // nil: the system's roots, no client certificate
}

// readExportSettings reads the settings from the flag's endpoint and the standard
// OTEL_EXPORTER_OTLP_* variables, the traces' own form of each variable before the general one,
// as every OpenTelemetry SDK reads them. A value the router cannot honour is an error, so that a
// deployment never believes it set something that is ignored; OTLP/gRPC, asked for by protocol
// or by port, is refused with the OTLP/HTTP port to use.
func readExportSettings(flagEndpoint string) (exportSettings, error) {
	s := exportSettings{timeout: defaultExportTimeout}
	switch name, v := otlpEnv("PROTOCOL"); v {
	case "", "http/protobuf":
	case "grpc":
		return s, fmt.Errorf("%s=grpc: traces are exported over OTLP/HTTP only; set http/protobuf (or leave it unset) and point the endpoint at the collector's OTLP/HTTP port (%s by convention)", name, otlpHTTPPort)
	default:
		return s, fmt.Errorf("%s=%s: want http/protobuf, the only encoding exported", name, v)
	}
	var err error
	if s.url, err = exportURL(flagEndpoint); err != nil {
		return s, err
	}
	if name, v := otlpEnv("HEADERS"); v != "" {
		if s.headers, err = parseHeaders(v); err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
	}
	if name, v := otlpEnv("TIMEOUT"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return s, fmt.Errorf("%s=%s: want a positive number of milliseconds", name, v)
		}
		s.timeout = time.Duration(ms) * time.Millisecond
	}
	switch name, v := otlpEnv("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		s.gzip = true
	default:
		return s, fmt.Errorf("%s=%s: want gzip or none", name, v)
	}
	s.tls, err = exportTLS()
	return s, err
}

// exportURL is where spans go: the flag's endpoint (the path /v1/traces when it has none), else
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces
// appended to its path.
func exportURL(flagEndpoint string) (string, error) {
	if flagEndpoint != "" {
		if err := CheckEndpoint(flagEndpoint); err != nil {
			return "", fmt.Errorf("--otlp-traces-endpoint %w", err)
		}
		if u, _ := url.Parse(flagEndpoint); u.Path == "" || u.Path == "/" {
			return strings.TrimSuffix(flagEndpoint, "/") + "/v1/traces", nil
		}
		return flagEndpoint, nil
	}
	name, v := firstSet("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if err := CheckEndpoint(v); err != nil {
		return "", fmt.Errorf("%s %w", name, err)
	}
	if name == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" {
		return v, nil
	}
	return url.JoinPath(v, "v1/traces")
}

// parseHeaders reads the headers variable's form: key=value pairs separated by commas, each
// value percent-encoded.
func parseHeaders(v string) ([][2]string, error) {
	var hs [][2]string
	for pair := range strings.SplitSeq(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || !isToken(k) {
			return nil, fmt.Errorf("%q: want key=value pairs separated by commas", pair)
		}
		val, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil || strings.ContainsAny(val, "\r\n\x00") {
			return nil, fmt.Errorf("header %s: the value is not a percent-encoded header value", k)
		}
		hs = append(hs, [2]string{k, val})
	}
	return hs, nil
}

// isToken reports whether k is a valid header name (an RFC 9110 token).
func isToken(k string) bool {
	return k != "" && !strings.ContainsFunc(k, func(r rune) bool {
		return r > '~' || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	})
}

// exportTLS reads the CA certificate that verifies the collector and the client certificate and
// key the router presents to it; nil when none is set.
func exportTLS() (*tls.Config, error) {
	caName, ca := otlpEnv("CERTIFICATE")
	certName, cert := otlpEnv("CLIENT_CERTIFICATE")
	keyName, key := otlpEnv("CLIENT_KEY")
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caName, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", caName, ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("%s%s: a client certificate and its key come in pairs: set both OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_KEY", certName, keyName)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", certName, keyName, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// otlpEnv returns the traces' form of an OTLP exporter variable if it is set, else the general
// form: OTEL_EXPORTER_OTLP_TRACES_<suffix>, else OTEL_EXPORTER_OTLP_<suffix>.
func otlpEnv(suffix string) (name, value string) {
	return firstSet("OTEL_EXPORTER_OTLP_TRACES_"+suffix, "OTEL_EXPORTER_OTLP_"+suffix)
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
