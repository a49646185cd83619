package enginemetrics

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/upstream"
)

// serveMetrics starts a worker whose every answer is the metrics text, over TLS when overTLS is
// set, and closes it when the test ends.
func serveMetrics(t *testing.T, text string, overTLS bool) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(text))
	}))
	if overTLS {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

func TestScrapeReadsAChunkedAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 2\n"))
		w.(http.Flusher).Flush() // from here on the answer is chunked
		_, _ = w.Write([]byte("vllm:num_requests_waiting{a=\"b\"} 5\n"))
	}))
	defer srv.Close()
	pool := enginePool(t, 1, srv.URL)
	s := newScraper(pool, Options{Interval: time.Second})
	defer s.Close()
	for range 2 { // the second over the kept connection
		if err := s.Scrape(t.Context(), srv.URL); err != nil {
			t.Fatal(err)
		}
		if got := pool.All()[0].Load(); got != 7 {
			t.Fatalf("Load = %d, want 7", got)
		}
	}
}

func TestScrapeSendsTheURLsCredentialsAndPathPrefix(t *testing.T) {
	var path, user, pass string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		user, pass, _ = r.BasicAuth()
		_, _ = w.Write([]byte("sglang:num_running_reqs 1\n"))
	}))
	defer srv.Close()
	u := strings.Replace(srv.URL, "http://", "http://me:secret@", 1) + "/gpu0"
	pool := enginePool(t, 1, u)
	s := newScraper(pool, Options{Interval: time.Second})
	defer s.Close()
	if err := s.Scrape(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	if path != "/gpu0/metrics" || user != "me" || pass != "secret" {
		t.Fatalf("path %q, credentials %q:%q", path, user, pass)
	}
}

func TestScrapeRedialsAConnectionTheWorkerClosed(t *testing.T) {
	srv := serveMetrics(t, "vllm:num_requests_running 3\n", false)
	pool := enginePool(t, 1, srv.URL)
	s := newScraper(pool, Options{Interval: time.Second})
	defer s.Close()
	if err := s.Scrape(t.Context(), srv.URL); err != nil {
		t.Fatal(err)
	}
	srv.CloseClientConnections() // the worker drops the idle kept-alive connection
	if err := s.Scrape(t.Context(), srv.URL); err != nil {
		t.Fatalf("scrape after the worker closed the kept connection: %v", err)
	}
	if w := pool.All()[0]; w.ScrapeErrors() != 0 || w.Load() != 3 {
		t.Fatalf("errors %d, Load %d", w.ScrapeErrors(), w.Load())
	}
}

func TestScrapeOverTLSTrustsTheGivenCAs(t *testing.T) {
	srv := serveMetrics(t, "vllm:num_requests_running 4\n", true)
	pool := enginePool(t, 1, srv.URL)
	untrusting := newScraper(pool, Options{Interval: time.Second})
	if err := untrusting.Scrape(t.Context(), srv.URL); err == nil {
		t.Fatal("a worker certificate from an unknown CA was accepted")
	}
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	s := New(pool, Options{Interval: time.Second, Dialer: upstream.Dialer{TLS: &tls.Config{RootCAs: roots}}}, quiet())
	defer s.Close()
	if err := s.Scrape(t.Context(), srv.URL); err != nil {
		t.Fatal(err)
	}
	if got := pool.All()[0].Load(); got != 4 {
		t.Fatalf("Load = %d, want 4", got)
	}
}
