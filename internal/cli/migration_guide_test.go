package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// docs/migrating-from-vllm-router.md lists the vLLM router's flags and routes with what each
// does here; these tests hold it to the code.

const migrationGuide = "migrating-from-vllm-router.md"

// guideRows returns the rows of every table of the guide whose header row begins with header,
// each as its cells, trimmed.
func guideRows(t *testing.T, header string) [][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", migrationGuide))
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "| "+header+" |"):
			in = true
		case !strings.HasPrefix(line, "|"):
			in = false
		case in && !strings.HasPrefix(line, "|---"):
			line = strings.ReplaceAll(line, `\|`, "/") // an escaped bar inside a cell
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
				cells = append(cells, strings.TrimSpace(c))
			}
			rows = append(rows, cells)
		}
	}
	if len(rows) == 0 {
		t.Fatalf("docs/%s has no table headed %q", migrationGuide, header)
	}
	return rows
}

// codeSpans are the texts between backticks in cell.
func codeSpans(cell string) []string {
	var out []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// Every flag of the vLLM router the guide names is one the root command takes; the ones it says
// have no effect are those the router accepts and warns about, and those it says do something
// are not; every flag accepted with no effect is in the guide.
func TestMigrationGuideFlagsAreTheRootCommandsFlags(t *testing.T) {
	root := newRootCommand()
	root.InitDefaultHelpFlag()
	fs := root.Flags()
	var named []string
	for _, row := range guideRows(t, "vLLM router flag") {
		noEffect := strings.HasPrefix(row[3], "accepted, no effect")
		for _, flag := range codeSpans(row[0]) {
			switch {
			case strings.HasPrefix(flag, "--"):
				name := strings.TrimPrefix(flag, "--")
				named = append(named, name)
				if fs.Lookup(name) == nil {
					t.Errorf("the guide names %s, which the router does not take", flag)
				} else if config.IsIgnoredFlag(name) != noEffect {
					t.Errorf("%s: the guide says %q, the router ignores it: %v", flag, row[3], config.IsIgnoredFlag(name))
				}
			case strings.HasPrefix(flag, "-"):
				if fs.ShorthandLookup(strings.TrimPrefix(flag, "-")) == nil {
					t.Errorf("the guide names %s, which the router does not take", flag)
				}
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if config.IsIgnoredFlag(f.Name) && !slices.Contains(named, f.Name) {
			t.Errorf("--%s is accepted with no effect and missing from the guide", f.Name)
		}
	})
}

// recordingWorker answers every request 200, with its model list on /v1/models, and records the
// method and path of each request it gets.
type recordingWorker struct {
	*httptest.Server
	mu  sync.Mutex
	got []string
}

func newRecordingWorker(t *testing.T) *recordingWorker {
	w := &recordingWorker{}
	w.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(rw, `{"object":"list","data":[{"id":"m"}]}`)
			return
		}
		if r.URL.Path != "/health" && r.URL.Path != "/metrics" {
			w.mu.Lock()
			w.got = append(w.got, r.Method+" "+r.URL.Path)
			w.mu.Unlock()
		}
		_, _ = io.WriteString(rw, `{"id":"resp_1","object":"ok"}`)
	}))
	t.Cleanup(w.Close)
	return w
}

func (w *recordingWorker) received(method, path string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.got, method+" "+path)
}

// Every route of the guide's table is handled as its last column says, by a router started from
// the command line: routed requests reach the worker and are counted under their own path,
// forwarded ones reach it and are counted under /{path}, and the router's own are answered by it
// with a method it takes.
func TestMigrationGuideRoutesAreHandledAsItSays(t *testing.T) {
	w := newRecordingWorker(t)
	port := strconv.Itoa(testkit.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	var logs testkit.SyncBuffer
	done := testkit.Go(t, cancel, func() error {
		return Execute(ctx, []string{"--worker-urls", w.URL, "--policy", "round_robin", "--port", port,
			"--prometheus-port", "0", "--log-level", "error"}, &logs, &logs)
	})
	base := "http://127.0.0.1:" + port
	waitHealthy(t, base, done, &logs)
	client := &http.Client{Timeout: 10 * time.Second}
	for _, row := range guideRows(t, "route") {
		handled := codeSpans(row[3])
		if len(handled) != 1 || !slices.Contains([]string{"routed", "forwarded", "router"}, handled[0]) {
			t.Fatalf("route row %q: the last column names no way of handling it", row)
		}
		for _, route := range codeSpans(row[0]) {
			method, path, ok := strings.Cut(route, " ")
			if !ok {
				t.Fatalf("route %q is not METHOD /path", route)
			}
			target := strings.NewReplacer("{id}", "resp_1", "{url}", url.PathEscape(w.URL)).Replace(path)
			req := guideRequest(t, method, base+target, path)
			before := routeCount(t, client, base)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", route, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fromWorker := resp.Header.Get(proxy.HeaderWorker) != ""
			after := routeCount(t, client, base)
			switch handled[0] {
			case "routed":
				if !fromWorker || !w.received(method, target) || after[path] != before[path]+1 {
					t.Errorf("%s: %d %s; want it routed to the worker and counted under %s (%v → %v)", route, resp.StatusCode, body, path, before[path], after[path])
				}
			case "forwarded":
				if !fromWorker || !w.received(method, target) || after["/{path}"] != before["/{path}"]+1 {
					t.Errorf("%s: %d %s; want it forwarded to the worker and counted under /{path}", route, resp.StatusCode, body)
				}
			case "router":
				if fromWorker || resp.StatusCode == http.StatusMethodNotAllowed || after["/{path}"] != before["/{path}"] {
					t.Errorf("%s: %d %s, from a worker: %v; want the router's own answer", route, resp.StatusCode, body, fromWorker)
				}
			}
		}
	}
}

// guideRequest is a request the route accepts: a JSON body any of the routed readers takes, or
// a multipart one for the audio routes.
func guideRequest(t *testing.T, method, target, path string) *http.Request {
	t.Helper()
	var body bytes.Buffer
	contentType := "application/json"
	switch {
	case method == http.MethodGet || method == http.MethodHead || method == http.MethodDelete:
	case strings.HasPrefix(path, "/v1/audio/"):
		mw := multipart.NewWriter(&body)
		_ = mw.WriteField("model", "m")
		fw, _ := mw.CreateFormFile("file", "a.wav")
		_, _ = fw.Write([]byte("RIFF"))
		_ = mw.Close()
		contentType = mw.FormDataContentType()
	case path == "/workers":
		fmt.Fprintf(&body, `{"url":"http://127.0.0.1:1"}`)
	default:
		body.WriteString(`{"model":"m","max_tokens":1,"prompt":"hi","input":"hi","messages":[{"role":"user","content":"hi"}]}`)
	}
	req, err := http.NewRequest(method, target, &body)
	if err != nil {
		t.Fatal(err)
	}
	if body.Len() > 0 {
		req.Header.Set("Content-Type", contentType)
	}
	return req
}

// routeCount reads vllm_router_requests_total from /metrics, summed by route.
func routeCount(t *testing.T, client *http.Client, base string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, m := range regexp.MustCompile(`(?m)^vllm_router_requests_total\{route="([^"]+)",status_class="[^"]+"\} (\S+)$`).FindAllStringSubmatch(string(text), -1) {
		var v float64
		fmt.Sscan(m[2], &v)
		out[m[1]] += v
	}
	return out
}

// waitHealthy waits until the router at base answers /health 200, failing the test when it
// stopped (its error came on stopped) or did not within testkit.Patience.
func waitHealthy(t *testing.T, base string, stopped chan error, logs *testkit.SyncBuffer) {
	t.Helper()
	healthy := testkit.Poll(testkit.Patience, 20*time.Millisecond, func() bool {
		select {
		case err := <-stopped:
			stopped <- err // for the cleanup, which waits on it too
			t.Fatalf("the router stopped: %v\n%s", err, logs)
		default:
		}
		resp, err := http.Get(base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !healthy {
		t.Fatalf("the router did not become healthy\n%s", logs)
	}
}
