package sim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// sseEvents reads every "data:" payload of an event stream.
func sseEvents(t *testing.T, resp *http.Response) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, data)
		} else if line != "" {
			t.Fatalf("unexpected stream line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func post(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestStream_ChatOverLoopback(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TimeScale = 0.001 // paced, so every token is flushed on its own
	fleet, err := StartLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	url := fleet.URLs()[1]

	body := `{"model":"sim-model","messages":[{"role":"user","content":"stream please"}],
		"max_tokens":12,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`
	resp := post(t, url+"/v1/chat/completions", body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got, want := resp.Header.Get(HeaderWorker), strings.TrimPrefix(url, "http://"); got != want {
		t.Fatalf("%s = %q, want %q", HeaderWorker, got, want)
	}
	events := sseEvents(t, resp)

	// role, 12 content deltas, finish, usage, [DONE]
	if len(events) != 16 || events[15] != "[DONE]" {
		t.Fatalf("%d events, last %q; want 16 ending in [DONE]", len(events), events[len(events)-1])
	}
	chunks := decodeChunks(t, events[:15])
	if r := chunks[0].Choices[0].Delta.Role; r == nil || *r != "assistant" {
		t.Fatal("first chunk carries no assistant role")
	}
	var text strings.Builder
	for _, c := range chunks[1:13] {
		if c.Choices[0].Delta.Content == nil || c.Choices[0].FinishReason != nil {
			t.Fatalf("content chunk malformed: %+v", c)
		}
		text.WriteString(*c.Choices[0].Delta.Content)
	}
	if f := chunks[13].Choices[0].FinishReason; f == nil || *f != "length" {
		t.Fatal("final chunk has no finish_reason length")
	}
	u := chunks[14].Usage
	if len(chunks[14].Choices) != 0 || u == nil || u.CompletionTokens != 12 || u.PromptTokens == 0 {
		t.Fatalf("usage chunk: %+v", chunks[14])
	}

	// The same request without streaming gives the same text.
	resp2 := post(t, url+"/v1/chat/completions", strings.Replace(body, `"stream":true`, `"stream":false`, 1))
	var whole chatReply
	if err := json.NewDecoder(resp2.Body).Decode(&whole); err != nil {
		t.Fatal(err)
	}
	if whole.Choices[0].Message.Content != text.String() {
		t.Fatalf("streamed %q, whole %q", text.String(), whole.Choices[0].Message.Content)
	}
	if s := fleet.Workers()[0].Stats(); s.Requests != 0 {
		t.Fatal("worker 0 served requests sent to worker 1")
	}
}

func TestStream_CompletionWithoutUsage(t *testing.T) {
	fleet, err := StartLocal(1, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	resp := post(t, fleet.URLs()[0]+"/v1/completions",
		`{"prompt":"Once upon a time","max_tokens":5,"ignore_eos":true,"stream":true}`)
	events := sseEvents(t, resp)
	if len(events) != 7 || events[6] != "[DONE]" {
		t.Fatalf("events %q; want 5 tokens, a finish chunk and [DONE]", events)
	}
	for _, e := range events[:5] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil || c.Object != "text_completion" || !strings.HasPrefix(c.Choices[0].Text, " ") {
			t.Fatalf("completion chunk %q (%v)", e, err)
		}
	}
	if strings.Contains(strings.Join(events, ""), `"usage"`) {
		t.Fatal("usage sent without stream_options.include_usage")
	}
}

func TestStream_PacedByTheClock(t *testing.T) {
	cfg, clock := clockedConfig()
	fleet, err := StartLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	resp := post(t, fleet.URLs()[0]+"/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true,"stream":true}`)
	// Nothing arrives until prefill is over; then one token per advance.
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	w := fleet.Workers()[0]
	testkit.WaitFor(t, "prefill", func() bool { return clock.Sleepers() == 1 })
	if w.Stats().GenerationTokens != 0 {
		t.Fatal("tokens before prefill")
	}
	clock.Advance(time.Second) // prefill done: role + first token
	for range 2 {
		<-lines
	}
	for range 2 {
		testkit.WaitFor(t, "inter-token sleep", func() bool { return clock.Sleepers() == 1 })
		clock.Advance(cfg.InterTokenLatency)
		<-lines
	}
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if len(rest) != 2 || rest[1] != "data: [DONE]" {
		t.Fatalf("stream tail %q", rest)
	}
}
