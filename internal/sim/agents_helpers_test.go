package sim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// Helpers of the Responses and Messages API tests.

type respReply struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Status             string  `json:"status"`
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id"`
	Store              bool    `json:"store"`
	Output             []struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		Role      string `json:"role"`
		Status    string `json:"status"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		Content   []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// text returns the reply's output text.
func (r *respReply) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

type msgReply struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	Model      string `json:"model"`
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	Usage struct {
		InputTokens              int `json:"input_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
		OutputTokens             int `json:"output_tokens"`
	} `json:"usage"`
}

func (r *msgReply) text() string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// prompt is the prompt the reply's usage stands for: Anthropic's
// input_tokens leaves cache reads out.
func (r *msgReply) prompt() int { return r.Usage.InputTokens + r.Usage.CacheReadInputTokens }

// jsonBody marshals v, or returns it as is when it is a string.
func jsonBody(t testing.TB, v any) string {
	t.Helper()
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// createResponse posts a Responses request and decodes the 200 answer.
func createResponse(t testing.TB, h http.Handler, body any) respReply {
	t.Helper()
	rec := do(t, h, http.MethodPost, "/v1/responses", jsonBody(t, body))
	return decodeOK[respReply](t, rec)
}

// createMessage posts a Messages request and decodes the 200 answer.
func createMessage(t testing.TB, h http.Handler, body any) msgReply {
	t.Helper()
	rec := do(t, h, http.MethodPost, "/v1/messages", jsonBody(t, body))
	return decodeOK[msgReply](t, rec)
}

// namedEvent is one server-sent event with its name.
type namedEvent struct {
	name string
	data string
}

// namedEvents reads a stream of named events: each an "event:" line, a
// "data:" line and a blank line, nothing else.
func namedEvents(t *testing.T, resp *http.Response) []namedEvent {
	t.Helper()
	return readEvents(t, resp, nil)
}

// readEvents is namedEvents that also hands each event to fn as it arrives,
// before the rest of the stream is read.
func readEvents(t *testing.T, resp *http.Response, fn func(namedEvent)) []namedEvent {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	var out []namedEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var cur namedEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: ") && cur.name == "":
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && cur.name != "" && cur.data == "":
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "" && cur.data != "":
			var typ struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal([]byte(cur.data), &typ); err != nil || typ.Type != cur.name {
				t.Fatalf("event %q carries data %s (%v)", cur.name, cur.data, err)
			}
			out = append(out, cur)
			if fn != nil {
				fn(cur)
			}
			cur = namedEvent{}
		default:
			t.Fatalf("unexpected stream line %q after %d events", line, len(out))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur.name != "" {
		t.Fatalf("stream ends inside event %q", cur.name)
	}
	return out
}

func eventNames(events []namedEvent) []string {
	names := make([]string, len(events))
	for i, e := range events {
		names[i] = e.name
	}
	return names
}

// startOne starts one worker on a loopback port.
func startOne(t *testing.T, cfg Config) (*Worker, string) {
	t.Helper()
	fleet, err := StartLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	return fleet.Workers()[0], fleet.URLs()[0]
}

// weatherTool is a function tool in the three APIs' spellings.
var weatherParams = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city": map[string]any{"type": "string"},
		"unit": map[string]any{"type": "string", "enum": []string{"celsius", "fahrenheit"}},
		"days": map[string]any{"type": "integer"},
	},
	"required": []string{"unit", "city"},
}

func responsesWeatherTool() map[string]any {
	return map[string]any{"type": "function", "name": "get_weather", "description": "Weather by city", "parameters": weatherParams}
}

func messagesWeatherTool() map[string]any {
	return map[string]any{"name": "get_weather", "description": "Weather by city", "input_schema": weatherParams}
}

// chatWeatherTool spells the tool as the Responses and Messages tools render:
// type, then function with name, description and parameters, in that order.
func chatWeatherTool() json.RawMessage {
	params, _ := json.Marshal(weatherParams)
	return json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"Weather by city","parameters":` + string(params) + `}}`)
}
