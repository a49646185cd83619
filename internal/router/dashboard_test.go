package router

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/cacheroute/cacheroute/internal/browsertest"
	"github.com/cacheroute/cacheroute/internal/dashboard"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The status page is opened in a real headless Chromium in front of a router and simulated
// workers, in windows 1,280 and 1,920 pixels wide; its rendered DOM is checked, and with
// UPDATE_SCREENSHOT=1 its screenshots are written to docs/images/dashboard-1280.png and
// dashboard-1920.png.

// browser returns the path of a Chromium-family browser. Without one the test fails in CI and is
// skipped elsewhere.
func browser(t *testing.T) string { return browsertest.Path(t) }

// newBrowser starts a headless browser with a window of 1,280 × 900 pixels for the test.
func newBrowser(t *testing.T, exe string) context.Context { return browsertest.New(t, exe, 1280, 900) }

// pageWidths are the window widths the status page is checked at: a laptop's and a desktop's.
var pageWidths = []int{1280, 1920}

// checkPageFits fails the test when the page in ctx cuts something off: when the workers table is
// wider than the box that holds it (so part of it needs scrolling to see) or a column of it ends
// past the box's edge, when another table spills out of its section, or when the page itself
// scrolls sideways.
func checkPageFits(t *testing.T, ctx context.Context, width int) {
	t.Helper()
	problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const box = document.querySelector("#workers").parentElement, edge = box.getBoundingClientRect().right, out = [];
		if (box.scrollWidth > box.clientWidth) out.push("the table is " + box.scrollWidth + " px wide in a box of " + box.clientWidth + " px");
		const cut = Array.from(document.querySelectorAll("#workers thead tr:last-child th")).filter(th => th.getBoundingClientRect().right > edge + 0.5);
		if (cut.length) out.push("the columns " + cut.map(th => JSON.stringify(th.textContent)).join(", ") + " end past the box");
		for (const table of document.querySelectorAll("section table:not(#workers)")) {
			if (table.getBoundingClientRect().right > table.closest("section").getBoundingClientRect().right + 0.5) out.push("the table #" + table.id + " spills out of its section");
		}
		if (document.documentElement.scrollWidth > window.innerWidth) out.push("the page is " + document.documentElement.scrollWidth + " px wide in a window of " + window.innerWidth);
		return out;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("at %d px: %s", width, p)
	}
}

func TestDashboardInBrowser(t *testing.T) {
	exe := browser(t)
	fleet := startSimFleet(t, 4)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startReplica(t, cfg, fleet)
	tr.CheckHealth(t.Context())
	tr.Start(t.Context()) // the background loops, the scrapes of the sims' /metrics among them

	// Agent traffic: a few sessions of several turns each, so the mix has more than one label.
	convs := make([]*conversation, 6)
	for i := range convs {
		convs[i] = newConversation(fmt.Sprintf("dash-session-%d", i))
	}
	for range 4 {
		for _, c := range convs {
			c.turn(t, tr)
		}
	}
	screenshots := os.Getenv("UPDATE_SCREENSHOT") == "1"
	if screenshots {
		// A few more seconds of traffic, new sessions among it, so the charts have a shape.
		for i := range 12 {
			fresh := newConversation(fmt.Sprintf("dash-late-%d", i))
			for range 1 + i%3 {
				fresh.turn(t, tr)
			}
			for _, c := range convs[:1+i%len(convs)] {
				c.turn(t, tr)
			}
			time.Sleep(time.Second)
		}
	}
	for _, width := range pageWidths {
		ctx := browsertest.New(t, exe, width, 900)
		browserProblems := watchBrowser(t, ctx)
		err := chromedp.Do(ctx,
			chromedp.Navigate(tr.url+"/dashboard"),
			chromedp.WaitVisible(chromedp.CSS(`body[data-ready="1"]`)),
			// The counters are sampled once a second: wait until the page shows the traffic.
			chromedp.Poll[chromedp.Void](`document.querySelectorAll("#decisions td.count").length > 0 &&
				document.querySelectorAll("#mix path").length > 0`, chromedp.WithPollingTimeout(60*time.Second)), // a loaded machine starts a browser slowly
		)
		if err != nil {
			t.Fatalf("at %d px the page did not render its data: %v (browser problems: %v)", width, err, browserProblems())
		}
		if width == pageWidths[0] {
			checkDashboardContent(t, ctx, tr, 4*len(convs))
		}
		checkPageFits(t, ctx, width)
		if screenshots {
			if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`document.querySelectorAll("#rate-legend span").length > 0 &&
				document.getElementById("kpis").textContent.includes("requests since start")`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // one more poll of the page, which shows the last second
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("..", "..", "docs", "images", fmt.Sprintf("dashboard-%d.png", width))
			if err := os.WriteFile(path, png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if p := browserProblems(); len(p) > 0 {
			t.Errorf("at %d px the browser reported: %v", width, p)
		}
	}
}

// checkDashboardContent: the page lists every worker of the pool, counts the decisions of the
// requests sent, shows no session id, and a worker's row shows its cache and load.
func checkDashboardContent(t *testing.T, ctx context.Context, tr *testRouter, requests int) {
	t.Helper()
	names := map[string]bool{}
	for _, w := range tr.Pool().All() {
		names[w.Name()] = false
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#workers tr.worker")).map(r => r.dataset.name)`))
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Array.from(document.querySelectorAll("#decisions td.count")).reduce((s, td) => s + Number(td.textContent), 0)`))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range rows {
		if _, ok := names[name]; !ok {
			t.Errorf("the page lists %q, not a worker of the pool", name)
		}
		names[name] = true
	}
	for name, listed := range names {
		if !listed {
			t.Errorf("worker %s is not listed", name)
		}
	}
	if decisions <= 0 {
		t.Errorf("the page counts %d decisions after %d requests", decisions, requests)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "dash-session-") {
		t.Error("the page shows a session id")
	}
	checkWorkerCacheAndLoad(t, ctx, tr)
}

// watchBrowser collects the console errors, exceptions and error log entries of the page in ctx;
// the function it returns gives those seen so far.
func watchBrowser(t *testing.T, ctx context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var problems []string
	report := func(p string) {
		mu.Lock()
		problems = append(problems, p)
		mu.Unlock()
	}
	err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, a.Description+string(a.Value))
				}
				report("console." + string(ev.Type) + ": " + strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			p := "exception: " + ev.ExceptionDetails.Text
			if ex := ev.ExceptionDetails.Exception; ex != nil {
				p += " " + ex.Description
			}
			report(p)
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError {
				report("log: " + ev.Entry.Text + " " + ev.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("starting the browser: %v", err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

// TestDashboardGuard: the page and its data answer only callers allowed on the admin endpoints,
// and the data names no session.
func TestDashboardGuard(t *testing.T) {
	fleet := startSimFleet(t, 2)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.AdminAPIKey = "dash-admin-key"
	tr := startReplica(t, cfg, fleet)
	tr.CheckHealth(t.Context())
	newConversation("guard-session-1").turn(t, tr)

	get := func(path, key string) (int, string) { return tr.withKey(t, http.MethodGet, path, key) }
	for _, path := range []string{"/dashboard", "/dashboard/data"} {
		if code, _ := get(path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without the admin key: %d, want 401", path, code)
		}
		if code, _ := get(path, "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong key: %d, want 401", path, code)
		}
	}
	if code, body := get("/dashboard", "dash-admin-key"); code != http.StatusOK || !strings.Contains(body, "<svg") {
		t.Errorf("/dashboard with the admin key: %d", code)
	}
	code, body := get("/dashboard/data", "dash-admin-key")
	if code != http.StatusOK || !strings.Contains(body, `"workers"`) || strings.Contains(body, "guard-session-1") {
		t.Errorf("/dashboard/data with the admin key: %d %s", code, body)
	}
}

// TestDashboardManyWorkers: with 256 workers the page lists them all in a scrolling table that
// keeps the page's height bounded.
func TestDashboardManyWorkers(t *testing.T) {
	exe := browser(t)
	const n = 256
	ws := make([]*fakeWorker, n)
	for i := range ws {
		ws[i] = newFakeWorker(t)
	}
	tr := startRouter(t, testConfig(), ws...)
	ctx := newBrowser(t, exe)
	err := chromedp.Do(ctx,
		chromedp.Navigate(tr.url+"/dashboard"),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelectorAll("#workers tr.worker").length === %d`, n),
			chromedp.WithPollingTimeout(30*time.Second)),
	)
	if err != nil {
		t.Fatalf("the page did not list %d workers: %v", n, err)
	}
	height, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`document.querySelector("#workers").parentElement.getBoundingClientRect().height`))
	if err != nil {
		t.Fatal(err)
	}
	if height > 600 {
		t.Errorf("the worker table is %.0f px high; it should scroll within its box", height)
	}
	checkPageFits(t, ctx, 1280)
}

// settledData polls tr's /dashboard/data until two of its samples, a second or more apart, show
// the same prompt tokens: the traffic's answers are then all counted.
func settledData(t *testing.T, tr *testRouter) dashboard.Data {
	t.Helper()
	read := func() dashboard.Data {
		resp, err := http.Get(tr.url + "/dashboard/data")
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard.Data
		if err := json.Unmarshal([]byte(readAll(t, resp)), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	prompt := func(d dashboard.Data) (n float64) {
		for _, w := range d.Workers {
			n += w.Cache.PromptTokens
		}
		return n
	}
	last := func(d dashboard.Data) int64 {
		if len(d.History) == 0 {
			return 0
		}
		return d.History[len(d.History)-1].Time
	}
	prev := read()
	for range 60 {
		time.Sleep(500 * time.Millisecond)
		cur := read()
		if last(cur) > last(prev) {
			if prompt(cur) > 0 && prompt(cur) == prompt(prev) {
				return cur
			}
			prev = cur
		}
	}
	t.Fatalf("the dashboard's prompt tokens did not settle: %v", prompt(prev))
	return prev
}

// checkWorkerCacheAndLoad: after the traffic, a worker row shows the predicted and achieved hit
// rates the data holds (since start and over the recent window), its load under the signal the
// header names (engine, the default), the engine's figures from its /metrics and the scrape's age.
func checkWorkerCacheAndLoad(t *testing.T, ctx context.Context, tr *testRouter) {
	t.Helper()
	data := settledData(t, tr)
	if data.LoadSignal != "engine" {
		t.Fatalf("load signal %q, want engine (the default)", data.LoadSignal)
	}
	var busiest *dashboard.Worker
	for i, w := range data.Workers {
		if busiest == nil || w.Cache.PromptTokens > busiest.Cache.PromptTokens {
			busiest = &data.Workers[i]
		}
	}
	c := busiest.Cache
	if c.Predicted == nil || c.Achieved == nil || *c.Achieved == 0 {
		t.Fatalf("worker %s after multi-turn sessions: cache %+v (achieved %v)", busiest.Name, c, c.Achieved)
	}
	// The row's cells against the data, within the page's rounding to a tenth of a percent.
	want, _ := json.Marshal(map[string]any{"name": busiest.Name, "predicted": *c.Predicted * 100, "achieved": *c.Achieved * 100})
	check := fmt.Sprintf(`(() => {
		const want = %s;
		const row = Array.from(document.querySelectorAll("#workers tr.worker")).find(r => r.dataset.name === want.name);
		if (!row) return false;
		const cell = cls => row.querySelector("td." + cls).textContent;
		const near = (text, v) => /^[0-9.]+%%$/.test(text) && Math.abs(parseFloat(text) - v) <= 0.051;
		return near(cell("hit-predicted"), want.predicted) && near(cell("hit-achieved"), want.achieved) &&
			/%%$/.test(cell("hit-predicted-recent")) && /%%$/.test(cell("hit-achieved-recent")) &&
			/^[0-9]+$/.test(cell("corrections")) && /^[0-9]+$/.test(cell("load")) && cell("in-flight") === "0" &&
			/ \/ /.test(cell("engine")) && / ago(, [0-9]+ failed)?$/.test(cell("scrape")) &&
			document.getElementById("load-head").textContent === "load, signal engine" &&
			document.getElementById("policy").textContent.includes("load signal engine");
	})()`, want)
	if err := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](check, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		row, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(
			`(Array.from(document.querySelectorAll("#workers tr.worker")).find(r => r.dataset.name === %q) || {}).innerText`, busiest.Name)))
		head, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#workers thead").innerText`))
		t.Fatalf("the row of %s does not show its hit rates and load (want %s): %v\nheader: %s\nrow: %s", busiest.Name, want, err, head, row)
	}
}

// GET / names the status page beside the routed paths and the router's own endpoints, so that a
// browser pointed at the router's address finds it; other methods on / get 405.
func TestRootListsTheStatusPage(t *testing.T) {
	tr := startRouter(t, testConfig(), newFakeWorker(t))
	resp := mustGet(t, tr.url+"/")
	var index struct {
		StatusPage  string              `json:"status_page"`
		RoutedPaths []string            `json:"routed_paths"`
		Endpoints   map[string][]string `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &index); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d %v", resp.StatusCode, err)
	}
	if index.StatusPage != "/dashboard" || !slices.Contains(index.RoutedPaths, "/v1/chat/completions") ||
		!slices.Equal(index.Endpoints["/dashboard"], []string{"GET"}) || !slices.Equal(index.Endpoints["/health"], []string{"GET"}) {
		t.Fatalf("GET / lists %+v", index)
	}
	if page := mustGet(t, tr.url+index.StatusPage); page.StatusCode != http.StatusOK || !strings.Contains(readAll(t, page), "<title>cacheroute status</title>") {
		t.Errorf("the status page it names answers %d", page.StatusCode)
	}
	post := tr.post(t, "/", "{}")
	if readAll(t, post); post.StatusCode != http.StatusMethodNotAllowed || post.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /: %d, Allow %q", post.StatusCode, post.Header.Get("Allow"))
	}
}

// The start-up log line gives the status page's URL, which a browser on the router's host opens.
func TestStartUpLogGivesTheStatusPageURL(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.Host, cfg.Port, cfg.WorkerURLs = "127.0.0.1", 0, []string{w.URL()}
	var logs testkit.SyncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, slog.New(slog.NewTextHandler(&logs, nil))) }()
	defer func() { cancel(); <-done }()
	re := regexp.MustCompile(`msg="cacheroute listening" .* status_page=(http://127\.0\.0\.1:[0-9]+/dashboard)\n`)
	var url string
	for range 200 {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			url = m[1]
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if url == "" {
		t.Fatalf("no status page URL in the start-up log:\n%s", logs.String())
	}
	if page := mustGet(t, url); page.StatusCode != http.StatusOK || !strings.Contains(readAll(t, page), "<title>cacheroute status</title>") {
		t.Errorf("%s answers %d", url, page.StatusCode)
	}
}

func TestStatusPageURLNamesLocalhostForAWildcardAddress(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:30000": "http://localhost:30000/dashboard", "[::]:30000": "http://localhost:30000/dashboard",
		"10.0.0.5:8080": "http://10.0.0.5:8080/dashboard", "[::1]:30000": "http://[::1]:30000/dashboard",
	} {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := statusPageURL(tcp, false); got != want {
			t.Errorf("%s: %s, want %s", addr, got, want)
		}
	}
	if got := statusPageURL(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 443}, true); got != "https://127.0.0.1:443/dashboard" {
		t.Errorf("TLS: %s", got)
	}
}
