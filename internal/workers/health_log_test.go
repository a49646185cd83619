package workers

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// A worker that fails its probes says why: the reason is kept on the worker (for /health) and
// logged, once when the probes start failing, then at most once a minute while they go on
// failing, and once when they pass again.

// loggedChecker is a test checker whose log lines land in the returned buffer and whose clock
// is *now.
func loggedChecker(p *Pool, opts HealthOptions, now *time.Time) (*Checker, *testkit.SyncBuffer) {
	c := newTestChecker(p, opts)
	logs := &testkit.SyncBuffer{}
	c.log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c.now = func() time.Time { return *now }
	return c, logs
}

func TestProbeFailureReasonNamesTheCause(t *testing.T) {
	notFound := newFakeWorker(t, "/ready") // /health is not served: 404
	refused := func() string {
		ln := testkit.Listen(t)
		defer ln.Close()
		return "http://" + ln.Addr().String()
	}()
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })

	for _, tc := range []struct {
		name, url, want string
	}{
		{"status", notFound.srv.URL, "GET /health answered 404 Not Found"},
		{"connection refused", refused, "connection refused"},
		{"timeout", slow.URL, "GET /health: no answer within 50ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPool(Options{DPSize: 2})
			added, _ := p.Add(tc.url)
			now := time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)
			c, logs := loggedChecker(p, HealthOptions{Timeout: 50 * time.Millisecond}, &now)
			c.Check(context.Background(), tc.url)
			for _, w := range added {
				st, ok := w.Probe()
				if !ok || !strings.Contains(st.LastError, tc.want) || !st.LastErrorTime.Equal(now) || st.Failures != 1 {
					t.Errorf("%s probe status %+v (ok %v), want the reason %q at %v after 1 failure", w.ID(), st, ok, tc.want, now)
				}
			}
			if got := logs.Lines("worker health check failed"); len(got) != 1 || !strings.Contains(got[0], tc.want) {
				t.Errorf("log lines %q, want one failure line with %q", got, tc.want)
			}
		})
	}
}

func TestProbeFailuresAreLoggedOnceThenOncePerMinuteThenOnRecovery(t *testing.T) {
	f := newFakeWorker(t, "/health")
	p := NewPool(Options{})
	added, _ := p.Add(f.srv.URL)
	w := added[0]
	now := time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)
	c, logs := loggedChecker(p, HealthOptions{FailureThreshold: 3, SuccessThreshold: 1}, &now)
	ctx := context.Background()
	check := func(step time.Duration) {
		now = now.Add(step)
		c.Check(ctx, f.srv.URL)
	}
	count := func(msg string) int { return len(logs.Lines(msg)) }

	check(0) // healthy: nothing to say about probes
	f.status.Store(http.StatusServiceUnavailable)
	check(10 * time.Second)
	if count("worker health check failed") != 1 {
		t.Fatalf("first failure logged %d times, want once: %q", count("worker health check failed"), logs.Lines("health"))
	}
	for range 5 { // 50 s more of failures: the worker goes unhealthy, the probes stay quiet
		check(10 * time.Second)
	}
	if w.Healthy() {
		t.Fatal("still healthy after 6 failures of threshold 3")
	}
	if n := count("still failing"); n != 0 {
		t.Fatalf("%d repeat lines within the first minute, want none", n)
	}
	if n := count(`msg="worker health changed" worker=` + f.srv.URL + " healthy=false"); n != 1 {
		t.Errorf("the change to unhealthy logged %d times, want once", n)
	}
	check(10 * time.Second) // a minute after the first line
	if lines := logs.Lines("still failing"); len(lines) != 1 || !strings.Contains(lines[0], "503 Service Unavailable") || !strings.Contains(lines[0], "failures=7") {
		t.Fatalf("repeat lines %q, want one with the reason and the failure count", lines)
	}
	check(30 * time.Second)
	if n := count("still failing"); n != 1 {
		t.Fatalf("%d repeat lines within a minute of the last, want 1", n)
	}
	if st, _ := w.Probe(); st.Failures != 8 {
		t.Errorf("probe status counts %d failures, want 8", st.Failures)
	}

	f.status.Store(http.StatusOK)
	check(10 * time.Second)
	if lines := logs.Lines("worker health check passed"); len(lines) != 1 || !strings.Contains(lines[0], "after_failures=8") {
		t.Fatalf("recovery lines %q, want one that counts the failures", lines)
	}
	st, ok := w.Probe()
	if !ok || st.Failures != 0 || !strings.Contains(st.LastError, "503") {
		t.Errorf("after a pass the probe status is %+v (ok %v), want the last error kept with 0 failures", st, ok)
	}
	check(10 * time.Second)
	if n := count("worker health check passed"); n != 1 {
		t.Errorf("passing probes logged %d times, want once", n)
	}

	// A new run of failures is a new change: logged at once.
	f.status.Store(http.StatusNotFound)
	check(time.Second)
	if lines := logs.Lines("worker health check failed"); len(lines) != 2 || !strings.Contains(lines[1], "404 Not Found") {
		t.Errorf("failure lines %q, want a second one with the new reason", lines)
	}
}

func TestProbeFailureReasonNeverShowsTheWorkerCredentials(t *testing.T) {
	f := newFakeWorker(t, "/ready") // /health answers 404
	url := strings.Replace(f.srv.URL, "http://", "http://user:s3cret@", 1)
	closed := func() string {
		ln := testkit.Listen(t)
		defer ln.Close()
		return "http://user:s3cret@" + ln.Addr().String()
	}()
	for _, u := range []string{url, closed} {
		p := NewPool(Options{})
		added, _ := p.Add(u)
		now := time.Now()
		c, logs := loggedChecker(p, HealthOptions{}, &now)
		c.Check(context.Background(), u)
		st, _ := added[0].Probe()
		if st.LastError == "" || strings.Contains(st.LastError, "s3cret") {
			t.Errorf("probe error %q: empty or shows the password", st.LastError)
		}
		for _, l := range logs.Lines("worker") {
			if strings.Contains(l, "s3cret") {
				t.Errorf("log line shows the password: %s", l)
			}
		}
	}
}
