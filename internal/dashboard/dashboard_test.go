package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/workers"
)

func newTest(t *testing.T) (*Dashboard, *metrics.Metrics, *time.Time) {
	t.Helper()
	pool := workers.NewPool(workers.Options{CBFailureThreshold: 5, CBTimeout: time.Second})
	if _, err := pool.Add("http://user:s3cret@127.0.0.1:9"); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(pool)
	now := time.Unix(1_700_000_000, 0)
	d := New(Options{Pool: pool, Metrics: m, Policy: "cache_aware"})
	d.clock = func() time.Time { return now }
	return d, m, &now
}

func TestHistoryIsPerSecondAndBounded(t *testing.T) {
	d, m, now := newTest(t)
	for i := range Samples + 50 {
		m.Requests.WithLabelValues("/v1/chat/completions", "2xx").Add(3)
		if i%2 == 0 {
			m.Requests.WithLabelValues("/v1/chat/completions", "5xx").Inc()
		}
		m.CacheAwareDecisions.WithLabelValues("session_id_match").Add(2)
		*now = now.Add(time.Second)
		d.Sample()
	}
	data := d.Data(context.Background())
	if len(data.History) != Samples-1 {
		t.Fatalf("history holds %d seconds, want %d", len(data.History), Samples-1)
	}
	for _, s := range data.History {
		if s.Requests < 3 || s.Requests > 4 || s.Decisions["session_id_match"] != 2 {
			t.Fatalf("a second of history: %+v", s)
		}
	}
	if want := (Samples + 50) * 2; data.Decisions["session_id_match"] != want {
		t.Fatalf("decisions since start %v, want %d", data.Decisions, want)
	}
	if last := data.History[len(data.History)-1]; last.Time != now.Unix() {
		t.Fatalf("last second at %d, want %d", last.Time, now.Unix())
	}
}

func TestDataShowsNoCredentials(t *testing.T) {
	d, _, _ := newTest(t)
	d.Sample()
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dashboard/data", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK || regexp.MustCompile(`s3cret|user:`).MatchString(body) {
		t.Fatalf("status %d, body %s", rec.Code, body)
	}
	var data Data
	if err := json.Unmarshal(rec.Body.Bytes(), &data); err != nil || len(data.Workers) != 1 {
		t.Fatalf("body %s: %v", body, err)
	}
}

func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	d, _, _ := newTest(t)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dashboard", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("content type %q", ct)
	}
	if m := regexp.MustCompile(`(?i)(src|href)\s*=|@import|url\(`).FindString(rec.Body.String()); m != "" {
		t.Fatalf("the page refers to another resource: %q", m)
	}
}
