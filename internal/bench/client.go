package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Response headers the bench reads. The router's names are also constants in internal/proxy;
// they are repeated here because any router or worker may set them, and the bench depends on
// the wire format, not on the router's code.
const (
	headerRouterWorker   = "x-vllm-router-worker"
	headerRouterDecision = "x-vllm-router-decision"
	headerPrefixMatch    = "x-vllm-router-prefix-match" // the predicted cached fraction of the routing text
	headerRouterPD       = "x-vllm-router-pd"           // the path a request took under P/D disaggregation
	headerSimWorker      = "x-sim-worker"               // the simulator's own header, for targets without a router
	headerSessionID      = "x-session-id"
)

// Session id modes: how a request names its session.
const (
	SessionHeader = "header" // header x-session-id
	SessionBody   = "body"   // body "session_params": {"session_id": ...}
	SessionNone   = "none"   // not at all: routers must fall back to the conversation history
)

// SessionModes lists the accepted session id modes.
var SessionModes = []string{SessionHeader, SessionBody, SessionNone}

// Record is the outcome of one request.
type Record struct {
	Session, Turn int
	Start         time.Duration // from the start of the run, wall clock
	TTFT          time.Duration // to the first event that carries content, wall clock
	// Gaps are the times between consecutive content-bearing events of the stream, wall clock:
	// the request's inter-token latencies.
	Gaps         []time.Duration
	E2E          time.Duration // to the end of the stream, wall clock
	PromptTokens int           // every prompt token, cached ones included, whatever the API
	CachedTokens int
	OutputTokens int
	Worker       string // the router's x-vllm-router-worker, else the simulator's x-sim-worker
	Decision     string // x-vllm-router-decision
	PD           string // x-vllm-router-pd: the path of a request under P/D disaggregation
	// PrefixMatch is x-vllm-router-prefix-match, the fraction of the prompt the router expected
	// its worker to hold, when HasPrefixMatch (the answer carried a valid one).
	PrefixMatch    float64
	HasPrefixMatch bool
	Status         int    // the HTTP status; 0 when no answer came
	Chained        bool   // the request continued a stored response (previous_response_id)
	Err            string // empty on success
	reply          string
	calls          []ToolCall
	responseID     string
}

// responseNotFound reports whether the request continued a stored response and the worker it
// reached did not have it.
func (r *Record) responseNotFound() bool { return r.Chained && r.Status == http.StatusNotFound }

// newHTTPClient returns a client for loopback or known targets: no environment proxy, enough
// idle connections for conns requests at once.
func newHTTPClient(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4 * max(conns, 16),
			MaxIdleConnsPerHost: max(conns, 16),
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// maxErrorBody bounds how much of an error answer is kept.
const maxErrorBody = 512

// maxTrailer bounds what is read of a stream after its final event.
const maxTrailer = 64 << 10

// send posts one turn to base in a's shape, reads the stream and fills rec with what came
// back. TTFT is measured at the first event with content (text, reasoning or a tool call), not
// at the headers, since a router or server may answer the headers before the first token.
func send(ctx context.Context, client *http.Client, base string, a api, x *exchange, rec *Record, began time.Time) {
	body, err := json.Marshal(a.body(x))
	if err != nil {
		rec.Err = err.Error()
		return
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+a.path(), bytes.NewReader(body))
	if err != nil {
		rec.Err = err.Error()
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	a.header(hreq.Header, x)
	rec.Chained = x.previousID != ""
	start := time.Now()
	rec.Start = start.Sub(began)
	resp, err := client.Do(hreq)
	if err != nil {
		rec.Err = shortError(err)
		return
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	rec.Worker = resp.Header.Get(headerRouterWorker)
	if rec.Worker == "" {
		rec.Worker = resp.Header.Get(headerSimWorker)
	}
	rec.Decision = resp.Header.Get(headerRouterDecision)
	rec.PD = resp.Header.Get(headerRouterPD)
	rec.PrefixMatch, rec.HasPrefixMatch = prefixMatch(resp.Header.Get(headerPrefixMatch))
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rec.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return
	}
	var st stream
	var last time.Time // of the last content-bearing event
	err = readEvents(resp.Body, func(data []byte) (bool, error) {
		before := st.contentEvents
		if err := a.event(data, &st); err != nil {
			return false, err
		}
		if st.contentEvents > before {
			now := time.Now()
			if last.IsZero() {
				rec.TTFT = now.Sub(start)
			} else {
				rec.Gaps = append(rec.Gaps, now.Sub(last))
			}
			last = now
		}
		return st.done, nil
	})
	rec.E2E = time.Since(start)
	if err == nil && st.done {
		// Read the stream to its end, as SDKs do: a client that hangs up after the final event
		// looks to the router like one that left before the answer was complete.
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxTrailer))
	}
	rec.PromptTokens, rec.CachedTokens, rec.OutputTokens = st.prompt, st.cached, st.output
	switch {
	case err != nil:
		rec.Err = shortError(err)
		return
	case !st.done:
		rec.Err = "stream ended without " + a.final()
	case st.prompt == 0:
		rec.Err = "no usage in the stream"
	case rec.TTFT == 0:
		rec.TTFT = rec.E2E // an empty reply: the first token is the end
	}
	rec.reply, rec.calls, rec.responseID = st.reply.String(), st.calls, st.responseID
}

// prefixMatch reads an x-vllm-router-prefix-match value, a fraction in [0, 1]; ok is false when
// it is absent or not one.
func prefixMatch(v string) (f float64, ok bool) {
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(f >= 0 && f <= 1) {
		return 0, false
	}
	return f, true
}

// readEvents reads a server-sent event stream and calls fn with the data of each event (its
// data lines joined by newlines) until fn reports the stream complete, fn fails or the stream
// ends. Event names, ids and comments are not needed: every API the bench speaks names an
// event's type in its data.
func readEvents(r io.Reader, fn func(data []byte) (stop bool, err error)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var data []byte
	pending := false
	dispatch := func() (bool, error) {
		if !pending {
			return false, nil
		}
		pending = false
		stop, err := fn(data)
		data = data[:0]
		if err != nil {
			return true, fmt.Errorf("bad stream event: %w", err)
		}
		return stop, nil
	}
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An event longer than the buffer: copy what was read before the buffer is reused,
			// then read the rest of the line.
			head := append([]byte(nil), line...)
			rest, err2 := br.ReadBytes('\n')
			line, err = append(head, rest...), err2
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 && err == nil {
			if stop, derr := dispatch(); stop || derr != nil {
				return derr
			}
		} else if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if pending {
				data = append(data, '\n')
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" "))...)
			pending = true
		}
		if err != nil {
			if err != io.EOF {
				return err
			}
			_, derr := dispatch()
			return derr
		}
	}
}

// shortError strips the request URL and method that net/http puts in front of errors.
func shortError(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "\": "); i >= 0 {
		return s[i+3:]
	}
	return s
}

// discoverModel asks base for its models and returns the first.
func discoverModel(ctx context.Context, client *http.Client, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models: no model listed (give --model)", base)
	}
	return list.Data[0].ID, nil
}
