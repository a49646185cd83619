package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestMessages_UsageSplitsUncachedAndCachedPrompt(t *testing.T) {
	w := newWorker(t, testConfig())
	rs := collect(w)
	body := map[string]any{"model": "sim-model", "max_tokens": 12, "ignore_eos": true,
		"system":   []any{map[string]any{"type": "text", "text": "You are terse."}},
		"messages": []any{map[string]any{"role": "user", "content": words("m", 800)}}}
	r1 := createMessage(t, w, body)
	if r1.Type != "message" || r1.Role != "assistant" || !strings.HasPrefix(r1.ID, "msg_") || r1.Model != "sim-model" ||
		r1.StopReason != "max_tokens" || len(r1.Content) != 1 || r1.Content[0].Type != "text" || r1.text() == "" {
		t.Fatalf("message %+v", r1)
	}
	res := rs.list()[0]
	if r1.Usage.InputTokens != res.PromptTokens || r1.Usage.CacheReadInputTokens != 0 || r1.Usage.OutputTokens != 12 || r1.Usage.CacheCreationInputTokens != 0 {
		t.Fatalf("first usage %+v, result %+v", r1.Usage, res)
	}
	r2 := createMessage(t, w, body)
	res = rs.list()[1]
	if r2.Usage.CacheReadInputTokens != res.CachedTokens || res.CachedTokens == 0 ||
		r2.Usage.InputTokens != res.PromptTokens-res.CachedTokens || r2.prompt() != r1.prompt() {
		t.Fatalf("repeat usage %+v, result %+v: input_tokens must leave the cache reads out", r2.Usage, res)
	}
	if r2.text() != r1.text() {
		t.Fatal("the same prompt gave another text")
	}
	// Without ignore_eos, a reply that ends early says end_turn.
	delete(body, "ignore_eos")
	ends := map[string]int{}
	for i := range 30 {
		body["messages"] = []any{map[string]any{"role": "user", "content": fmt.Sprint("q", i)}}
		ends[createMessage(t, w, body).StopReason]++
	}
	if ends["end_turn"] == 0 || ends["max_tokens"] == 0 || len(ends) != 2 {
		t.Fatalf("stop reasons %v", ends)
	}
}

func TestMessages_MissingMaxTokensIsAnthropicError(t *testing.T) {
	w := newWorker(t, testConfig())
	rec := do(t, w, "POST", "/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	want := `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`
	if rec.Code != 400 || rec.Body.String() != want {
		t.Fatalf("status %d body %s\nwant 400 %s", rec.Code, rec.Body, want)
	}
	if s := w.Stats(); s.Requests != 0 || s.Rejected != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMessages_ErrorsInAnthropicShape(t *testing.T) {
	checkRefusals(t, "/v1/messages", []refusal{
		{"malformed JSON", `{"max_tokens":`, 400, "invalid_request_error", "JSON"},
		{"missing messages", `{"max_tokens":5}`, 400, "invalid_request_error", "messages: Field required"},
		{"empty messages", `{"max_tokens":5,"messages":[]}`, 400, "invalid_request_error", "messages"},
		{"bad role", `{"max_tokens":5,"messages":[{"role":"tool","content":"x"}]}`, 400, "invalid_request_error", "messages.0.role"},
		{"bad content", `{"max_tokens":5,"messages":[{"role":"user","content":7}]}`, 400, "invalid_request_error", "messages.0.content"},
		{"max_tokens zero", `{"max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error", "max_tokens"},
		{"tool without name", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"input_schema":{}}]}`, 400, "invalid_request_error", "tools.0.name"},
		{"bad tool_choice", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"maybe"}}`, 400, "invalid_request_error", "tool_choice"},
		{"prompt too long", `{"max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 1200) + `"}]}`, 400, "invalid_request_error", "prompt is too long"},
		{"unknown model", `{"model":"claude-9","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error", "model: claude-9"},
	}, func(t *testing.T, rec *httptest.ResponseRecorder, r refusal) {
		var e anthropicError
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if rec.Code != r.code || e.Type != "error" || e.Error.Type != r.typ || !strings.Contains(e.Error.Message, r.msg) {
			t.Fatalf("status %d body %s, want %d %s mentioning %q", rec.Code, rec.Body, r.code, r.typ, r.msg)
		}
	})
}

func TestMessages_StreamEventsAndUsage(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TimeScale = 0.001
	w, url := startOne(t, cfg)
	rs := collect(w)
	body := `{"model":"sim-model","max_tokens":5,"ignore_eos":true,"messages":[{"role":"user","content":"` + words("s", 300) + `"}]}`
	whole := createMessage(t, w, body) // also leaves the prompt cached
	events := namedEvents(t, post(t, url+"/v1/messages", strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)))
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(eventNames(events), " "); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
	res := rs.list()[1]
	var start struct {
		Message msgReply `json:"message"`
	}
	json.Unmarshal([]byte(events[0].data), &start)
	m := start.Message
	if m.Type != "message" || m.Role != "assistant" || len(m.Content) != 0 || m.StopReason != "" ||
		m.Usage.InputTokens != res.PromptTokens-res.CachedTokens || m.Usage.CacheReadInputTokens != res.CachedTokens || res.CachedTokens == 0 {
		t.Fatalf("message_start %s, result %+v", events[0].data, res)
	}
	if events[1].data != `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` {
		t.Fatalf("content_block_start %s", events[1].data)
	}
	var text strings.Builder
	for _, e := range events[3:8] {
		var d struct {
			Index int `json:"index"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
		}
		json.Unmarshal([]byte(e.data), &d)
		if d.Index != 0 || d.Delta.Type != "text_delta" {
			t.Fatalf("delta %s", e.data)
		}
		text.WriteString(d.Delta.Text)
	}
	if text.String() != whole.text() {
		t.Fatalf("streamed %q, whole %q", text.String(), whole.text())
	}
	var delta struct {
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
			OutputTokens         int `json:"output_tokens"`
		} `json:"usage"`
	}
	json.Unmarshal([]byte(events[9].data), &delta)
	if delta.Delta.StopReason != "max_tokens" || delta.Usage.OutputTokens != 5 ||
		delta.Usage.InputTokens != m.Usage.InputTokens || delta.Usage.CacheReadInputTokens != m.Usage.CacheReadInputTokens {
		t.Fatalf("message_delta %s, message_start usage %+v", events[9].data, m.Usage)
	}
}

func TestMessages_StreamedToolUse(t *testing.T) {
	_, url := startOne(t, testConfig())
	body := jsonBody(t, map[string]any{"max_tokens": 64, "stream": true, "tools": []any{messagesWeatherTool()},
		"messages": []any{map[string]any{"role": "user", "content": "weather?"}}})
	events := namedEvents(t, post(t, url+"/v1/messages", body))
	n := len(events)
	var start struct {
		ContentBlock struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content_block"`
	}
	json.Unmarshal([]byte(events[1].data), &start)
	if b := start.ContentBlock; b.Type != "tool_use" || b.Name != "get_weather" || !strings.HasPrefix(b.ID, "toolu_") || string(b.Input) != "{}" {
		t.Fatalf("content_block_start %s", events[1].data)
	}
	var input strings.Builder
	for _, e := range events[3 : n-3] {
		var d struct {
			Delta struct {
				Type        string `json:"type"`
				PartialJSON string `json:"partial_json"`
			} `json:"delta"`
		}
		json.Unmarshal([]byte(e.data), &d)
		if e.name != "content_block_delta" || d.Delta.Type != "input_json_delta" || d.Delta.PartialJSON == "" {
			t.Fatalf("event %s %s", e.name, e.data)
		}
		input.WriteString(d.Delta.PartialJSON)
	}
	if !json.Valid([]byte(input.String())) || !strings.HasPrefix(input.String(), `{"city":`) {
		t.Fatalf("streamed input %q", input.String())
	}
	if !strings.Contains(events[n-2].data, `"stop_reason":"tool_use"`) || events[n-1].name != "message_stop" {
		t.Fatalf("tail %v", events[n-2:])
	}
}

// TestMessages_ToolUseLoopEnds runs an agent's loop: for each of three user
// tasks, call the tool the reply asks for until the reply is text.
func TestMessages_ToolUseLoopEnds(t *testing.T) {
	w := newWorker(t, testConfig())
	tools := []any{messagesWeatherTool(), map[string]any{"name": "read_file", "input_schema": map[string]any{"type": "object"}}}
	var msgs []any
	var stops []string
	var prevPrompt int
	for task := range 3 {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprint("task ", task, " ", words("t", 200))})
		for round := 0; ; round++ {
			if round > 3 {
				t.Fatalf("task %d: the loop does not end: %v", task, stops)
			}
			r := createMessage(t, w, map[string]any{"max_tokens": 48, "system": "You are an agent.", "tools": tools, "messages": msgs})
			stops = append(stops, r.StopReason)
			if prevPrompt > 0 && r.Usage.CacheReadInputTokens < prevPrompt/16*16 {
				t.Fatalf("request %d read %d cached tokens, previous prompt %d", len(stops), r.Usage.CacheReadInputTokens, prevPrompt)
			}
			prevPrompt = r.prompt()
			var content []any
			for _, c := range r.Content {
				if c.Type == "tool_use" {
					content = append(content, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": c.Input})
				} else {
					content = append(content, map[string]any{"type": "text", "text": c.Text})
				}
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "content": content})
			if r.StopReason != "tool_use" {
				break
			}
			msgs = append(msgs, map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": r.Content[0].ID, "content": "result of " + r.Content[0].Name}}})
		}
	}
	if len(stops) != 6 {
		t.Fatalf("stop reasons %v, want a call then an answer per task", stops)
	}
	for i, s := range stops {
		if (s == "tool_use") != (i%2 == 0) {
			t.Fatalf("stop reasons %v, want a call then an answer per task", stops)
		}
	}
}

func TestMessages_CountTokensEqualsThePrompt(t *testing.T) {
	w := newWorker(t, testConfig())
	body := map[string]any{"model": "sim-model", "system": "You are terse.", "tools": []any{messagesWeatherTool()},
		"messages": []any{
			map[string]any{"role": "user", "content": "weather in Paris?"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": map[string]any{"city": "Paris"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": []any{map[string]any{"type": "text", "text": "sunny"}}}}},
		}}
	rec := do(t, w, "POST", "/v1/messages/count_tokens", jsonBody(t, body))
	var n struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &n); err != nil || rec.Code != 200 || n.InputTokens == 0 {
		t.Fatalf("count_tokens: %d %s", rec.Code, rec.Body)
	}
	if s := w.Stats(); s.Requests != 0 {
		t.Fatal("count_tokens ran a generation")
	}
	body["max_tokens"] = 4
	if r := createMessage(t, w, body); r.prompt() != n.InputTokens {
		t.Fatalf("count_tokens %d, the request's prompt %d", n.InputTokens, r.prompt())
	}
	if rec := do(t, w, "POST", "/v1/messages/count_tokens", `{"messages":[]}`); rec.Code != 400 || !strings.Contains(rec.Body.String(), `"type":"error"`) {
		t.Fatalf("count_tokens without messages: %d %s", rec.Code, rec.Body)
	}
}

func TestMessages_Fault500InAnthropicShape(t *testing.T) {
	fleet := faultyFleet(t, FailHTTP500, testConfig())
	resp := post(t, fleet.URLs()[0]+"/v1/messages", `{"max_tokens":4,"messages":[{"role":"user","content":"x"}]}`)
	b, err := io.ReadAll(resp.Body)
	if want := `{"type":"error","error":{"type":"api_error","message":"simulated failure"}}`; err != nil || resp.StatusCode != http.StatusInternalServerError || string(b) != want {
		t.Fatalf("status %d body %s (%v)", resp.StatusCode, b, err)
	}
}
