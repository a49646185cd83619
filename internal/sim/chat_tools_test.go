package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// Tests of the tool-call rule on the chat API, which applies it only when the
// request sets tool_choice.

// chatToolReply is a chat answer with the fields a tool call uses; content is
// kept raw so that null and absent differ.
type chatToolReply struct {
	Choices []struct {
		Message struct {
			Role      string          `json:"role"`
			Content   json.RawMessage `json:"content"`
			ToolCalls []chatToolCall  `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage chatUsage `json:"usage"`
}

// call returns the reply's only tool call, or fails.
func (r chatToolReply) call(t *testing.T) chatToolCall {
	t.Helper()
	if len(r.Choices) != 1 || len(r.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("want one choice with one tool call: %+v", r.Choices)
	}
	return r.Choices[0].Message.ToolCalls[0]
}

// text returns the reply's content when it is text, or fails.
func (r chatToolReply) text(t *testing.T) string {
	t.Helper()
	var s string
	if len(r.Choices) != 1 || json.Unmarshal(r.Choices[0].Message.Content, &s) != nil || s == "" {
		t.Fatalf("want one choice with text content: %+v", r.Choices)
	}
	if n := len(r.Choices[0].Message.ToolCalls); n != 0 {
		t.Fatalf("a text reply with %d tool calls", n)
	}
	if f := r.Choices[0].FinishReason; f != "stop" && f != "length" {
		t.Fatalf("a text reply with finish_reason %q", f)
	}
	return s
}

// chatTools are the tools the chat tests offer: get_weather, then noop.
func chatTools() []any {
	return []any{chatWeatherTool(), json.RawMessage(`{"type":"function","function":{"name":"noop"}}`)}
}

// chatWithTools posts a chat request offering chatTools, with the fields of
// extra added, and decodes the 200 answer.
func chatWithTools(t *testing.T, h http.Handler, extra map[string]any, msgs ...any) chatToolReply {
	t.Helper()
	body := map[string]any{"messages": msgs, "tools": chatTools(), "max_tokens": 64}
	for k, v := range extra {
		body[k] = v
	}
	rec := do(t, h, http.MethodPost, "/v1/chat/completions", jsonBody(t, body))
	return decodeOK[chatToolReply](t, rec)
}

// chatAssistantCall is the assistant message a client sends back for call.
func chatAssistantCall(call chatToolCall) map[string]any {
	return map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{call}}
}

func chatToolResult(call chatToolCall, result string) map[string]any {
	return map[string]any{"role": "tool", "tool_call_id": call.ID, "content": result}
}

var weatherQuestion = map[string]any{"role": "user", "content": "weather in Paris?"}

func TestChat_ExplicitToolChoiceCallsATool(t *testing.T) {
	w := newWorker(t, testConfig())
	r := chatWithTools(t, w, map[string]any{"tool_choice": "auto"}, weatherQuestion)
	c := r.call(t)
	if !strings.HasPrefix(c.ID, "call_") || c.Type != "function" || c.Function.Name != "get_weather" {
		t.Fatalf("call %+v: want id call_…, type function, the first tool", c)
	}
	if !strings.HasPrefix(c.Function.Arguments, `{"city": "`) || !strings.HasSuffix(c.Function.Arguments, `", "unit": "celsius"}`) {
		t.Fatalf("arguments %s: want the required parameters in sorted order, the enum's first value", c.Function.Arguments)
	}
	if got := string(r.Choices[0].Message.Content); got != "null" {
		t.Fatalf("content %s with a tool call, want null", got)
	}
	if r.Choices[0].FinishReason != "tool_calls" || r.Choices[0].Message.Role != "assistant" {
		t.Fatalf("role %q, finish_reason %q; want assistant, tool_calls", r.Choices[0].Message.Role, r.Choices[0].FinishReason)
	}
	script := prompt.Tokenize(string(prompt.AppendToolCall(nil, prompt.ToolCall{Name: c.Function.Name, Arguments: c.Function.Arguments})))
	if r.Usage.CompletionTokens != len(script) {
		t.Fatalf("%d completion tokens, want the %d tokens the template renders for the call", r.Usage.CompletionTokens, len(script))
	}

	// The same conversation through the Responses API makes the same call.
	resp := createResponse(t, w, map[string]any{"input": []any{weatherQuestion}, "max_output_tokens": 64,
		"tools": []any{responsesWeatherTool(), map[string]any{"type": "function", "name": "noop"}}})
	if o := resp.Output[0]; o.Name != c.Function.Name || o.Arguments != c.Function.Arguments {
		t.Fatalf("chat called %s %s, the Responses API %s %s", c.Function.Name, c.Function.Arguments, o.Name, o.Arguments)
	}

	if c := chatWithTools(t, w, map[string]any{"tool_choice": "required"}, weatherQuestion).call(t); c.Function.Name != "get_weather" {
		t.Fatalf("tool_choice required: %+v", c)
	}
	// A forced call finishes with "stop", as vLLM and OpenAI answer it.
	named := map[string]any{"type": "function", "function": map[string]any{"name": "noop"}}
	r = chatWithTools(t, w, map[string]any{"tool_choice": named}, weatherQuestion)
	if c := r.call(t); c.Function.Name != "noop" || c.Function.Arguments != "{}" || r.Choices[0].FinishReason != "stop" {
		t.Fatalf("named tool_choice: %+v finishing with %q, want noop({}) finishing with stop", c, r.Choices[0].FinishReason)
	}
}

// The bench's chat workload offers tools every turn without tool_choice and
// expects text: the rule stays off for it.
func TestChat_ToolsWithoutToolChoiceAnswerText(t *testing.T) {
	w, url := startOne(t, testConfig())
	r := chatWithTools(t, w, nil, weatherQuestion)
	r.text(t)
	if r.Choices[0].Message.ToolCalls == nil {
		t.Fatal("tool_calls absent, want [] as vLLM answers")
	}
	chatWithTools(t, w, map[string]any{"tool_choice": nil}, weatherQuestion).text(t)

	body := jsonBody(t, map[string]any{"messages": []any{weatherQuestion}, "tools": chatTools(), "max_tokens": 8, "stream": true})
	for _, ev := range sseEvents(t, post(t, url+"/v1/chat/completions", body)) {
		if strings.Contains(ev, "tool_calls") {
			t.Fatalf("a streamed reply without tool_choice has a tool call: %s", ev)
		}
	}
}

func TestChat_ToolChoiceNoneAnswersText(t *testing.T) {
	w := newWorker(t, testConfig())
	chatWithTools(t, w, map[string]any{"tool_choice": "none"}, weatherQuestion).text(t)
}

func TestChat_TurnAfterTheToolResultIsText(t *testing.T) {
	w := newWorker(t, testConfig())
	auto := map[string]any{"tool_choice": "auto"}
	c := chatWithTools(t, w, auto, weatherQuestion).call(t)
	chatWithTools(t, w, auto, weatherQuestion, chatAssistantCall(c), chatToolResult(c, "sunny")).text(t)
	// The next user message calls the next tool.
	next := chatWithTools(t, w, auto, weatherQuestion, chatAssistantCall(c), chatToolResult(c, "sunny"),
		map[string]any{"role": "assistant", "content": "It is sunny."}, map[string]any{"role": "user", "content": "and tomorrow?"}).call(t)
	if next.Function.Name != "noop" {
		t.Fatalf("second call %+v, want noop", next)
	}
}

func TestChat_StreamedToolCall(t *testing.T) {
	w, url := startOne(t, testConfig())
	want := chatWithTools(t, w, map[string]any{"tool_choice": "auto"}, weatherQuestion).call(t)

	body := jsonBody(t, map[string]any{"messages": []any{weatherQuestion}, "tools": chatTools(), "tool_choice": "auto",
		"max_tokens": 64, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	events := sseEvents(t, post(t, url+"/v1/chat/completions", body))
	n := len(events)
	// role, the call's id and name, at least one arguments piece, finish, usage, [DONE]
	if n < 6 || events[n-1] != "[DONE]" {
		t.Fatalf("%d events: %q", n, events)
	}
	chunks := decodeChunks(t, events[:n-1])
	if d := chunks[0].Choices[0].Delta; d.Role == nil || *d.Role != "assistant" {
		t.Fatalf("first chunk %s, want the assistant role", events[0])
	}
	start := chunks[1].Choices[0].Delta.ToolCalls
	if len(start) != 1 || start[0].Index == nil || *start[0].Index != 0 || start[0].ID == nil || *start[0].ID == "" ||
		start[0].Type == nil || *start[0].Type != "function" || start[0].Function.Name == nil || *start[0].Function.Name != want.Function.Name {
		t.Fatalf("second chunk %s, want the call's index 0, id, type function and name %s", events[1], want.Function.Name)
	}
	var args strings.Builder
	for i := 2; i < n-3; i++ {
		c := chunks[i].Choices[0]
		tc := c.Delta.ToolCalls
		if len(tc) != 1 || tc[0].Index == nil || *tc[0].Index != 0 || tc[0].ID != nil || tc[0].Function.Name != nil ||
			tc[0].Function.Arguments == nil || *tc[0].Function.Arguments == "" || c.Delta.Content != nil || c.FinishReason != nil {
			t.Fatalf("chunk %d %s, want a piece of the arguments alone", i, events[i])
		}
		args.WriteString(*tc[0].Function.Arguments)
	}
	if args.String() != want.Function.Arguments {
		t.Fatalf("streamed arguments %q, the same request unstreamed called with %q", args.String(), want.Function.Arguments)
	}
	if f := chunks[n-3].Choices[0].FinishReason; f == nil || *f != "tool_calls" {
		t.Fatalf("last choice chunk %s, want finish_reason tool_calls", events[n-3])
	}
	script := prompt.Tokenize(string(prompt.AppendToolCall(nil, prompt.ToolCall{Name: want.Function.Name, Arguments: want.Function.Arguments})))
	if u := chunks[n-2]; len(u.Choices) != 0 || u.Usage == nil || u.Usage.CompletionTokens != len(script) {
		t.Fatalf("usage chunk %s, want %d completion tokens", events[n-2], len(script))
	}
}

// A client's tool loop over chat: three user tasks, each answered by a call,
// then by text once the call's result comes back. Every request finds the
// whole blocks of the previous request's prompt and reply cached, the call
// included, as the client renders it back.
func TestChat_ToolLoopCachesTurnByTurn(t *testing.T) {
	w := newWorker(t, testConfig())
	tasks := []string{words("task0", 300), "now the second task", "and the third"}
	msgs := []any{map[string]any{"role": "system", "content": "You are an agent."}}
	type request struct{ prompt, cached, completion int }
	var reqs []request
	calls := 0
	for _, task := range tasks {
		msgs = append(msgs, map[string]any{"role": "user", "content": task})
		for round := 0; ; round++ {
			if round == 4 {
				t.Fatalf("the tool loop does not end: %+v", reqs)
			}
			r := chatWithTools(t, w, map[string]any{"tool_choice": "auto", "max_tokens": 48, "ignore_eos": true}, msgs...)
			reqs = append(reqs, request{r.Usage.PromptTokens, r.Usage.PromptTokensDetails.CachedTokens, r.Usage.CompletionTokens})
			if len(r.Choices) == 1 && r.Choices[0].FinishReason != "tool_calls" {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": r.text(t)})
				break
			}
			c := r.call(t)
			calls++
			msgs = append(msgs, chatAssistantCall(c), chatToolResult(c, fmt.Sprintf("result %d", calls)))
		}
	}
	if len(reqs) != 6 || calls != 3 {
		t.Fatalf("%d requests with %d calls, want a call and an answer for each of 3 tasks: %+v", len(reqs), calls, reqs)
	}
	for i := 1; i < len(reqs); i++ {
		prev := reqs[i-1]
		// The previous prompt, its reply and the reply's end marker (3 tokens).
		want := (prev.prompt + prev.completion + 3) / 16 * 16
		if reqs[i].cached != want || reqs[i].cached <= prev.cached {
			t.Fatalf("request %d: %d cached tokens; request %d left %d prompt and %d reply tokens, %d in whole blocks: %+v",
				i+1, reqs[i].cached, i, prev.prompt, prev.completion, want, reqs)
		}
	}
}
