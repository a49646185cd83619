package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// turnUsage is what one turn cost and said, in any of the APIs.
type turnUsage struct {
	prompt, cached int
	reply          string
}

// agentStep is one turn of a conversation: a user message and, after it, a
// tool call the assistant made with its result (when name is set).
type agentStep struct {
	user                 string
	call, args, toolText string
}

func agentConversation() (system string, steps []agentStep) {
	return "You are a careful coding agent. " + words("sys", 300), []agentStep{
		{user: words("u1", 500)},
		{user: "Which function starts the server?"},
		// The arguments as vLLM writes a tool_use input back (Python's json.dumps), so that the
		// chat and Responses clients send what the Messages API renders.
		{user: "Read main.go and tell me.", call: "get_weather", args: `{"city": "Paris", "unit": "celsius"}`, toolText: "package main\n" + words("code", 400)},
		{user: "Now change the default port."},
	}
}

// Each runner sends the conversation through one API on a fresh worker, with
// tools offered and tool calls off (tool_choice none), and reports each turn.

func runChat(t *testing.T, system string, steps []agentStep) []turnUsage {
	w := newWorker(t, testConfig())
	msgs := []any{map[string]any{"role": "system", "content": system}}
	var out []turnUsage
	for _, s := range steps {
		msgs = append(msgs, map[string]any{"role": "user", "content": s.user})
		if s.call != "" {
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "c1", "type": "function",
					"function": map[string]any{"name": s.call, "arguments": s.args}}}},
				map[string]any{"role": "tool", "tool_call_id": "c1", "content": s.toolText})
		}
		rec := do(t, w, "POST", "/v1/chat/completions", jsonBody(t, map[string]any{"messages": msgs, "tools": []any{chatWeatherTool()}, "max_tokens": 20, "ignore_eos": true}))
		var r chatReply
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 {
			t.Fatalf("chat: %d %s", rec.Code, rec.Body)
		}
		reply := r.Choices[0].Message.Content
		out = append(out, turnUsage{r.Usage.PromptTokens, r.Usage.PromptTokensDetails.CachedTokens, reply})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": reply})
	}
	return out
}

func stepItems(s agentStep) []any {
	items := []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": s.user}}}}
	if s.call != "" {
		items = append(items,
			map[string]any{"type": "function_call", "call_id": "c1", "name": s.call, "arguments": s.args},
			map[string]any{"type": "function_call_output", "call_id": "c1", "output": s.toolText})
	}
	return items
}

// responsesClient is a Responses client's side of one conversation. With chain, each request
// sends only its new items after previous_response_id, the worker holding the rest; without, it
// resends the whole conversation and asks nothing to be stored.
type responsesClient struct {
	chain bool
	input []any // the conversation so far, for a full resend
	prev  string
}

// create sends items, the conversation's new input, with body's other fields, and returns the
// answer.
func (c *responsesClient) create(t *testing.T, w *Worker, body map[string]any, items []any) respReply {
	t.Helper()
	if c.chain {
		body["input"] = items
		if c.prev != "" {
			body["previous_response_id"] = c.prev
		}
	} else {
		c.input = append(c.input, items...)
		body["input"] = c.input
		body["store"] = false
	}
	r := createResponse(t, w, body)
	c.prev = r.ID
	return r
}

// answered adds the assistant's output to the conversation a full resend sends again (a chained
// request finds it in the stored response).
func (c *responsesClient) answered(items ...any) { c.input = append(c.input, items...) }

func runResponses(t *testing.T, system string, steps []agentStep, chain bool) []turnUsage {
	w := newWorker(t, testConfig())
	c := responsesClient{chain: chain}
	var out []turnUsage
	for _, s := range steps {
		r := c.create(t, w, map[string]any{"instructions": system, "tools": []any{responsesWeatherTool()}, "tool_choice": "none",
			"max_output_tokens": 20, "ignore_eos": true}, stepItems(s))
		out = append(out, turnUsage{r.Usage.InputTokens, r.Usage.InputTokensDetails.CachedTokens, r.text()})
		c.answered(map[string]any{"role": "assistant", "content": r.text()})
	}
	return out
}

func runMessages(t *testing.T, system string, steps []agentStep) []turnUsage {
	w := newWorker(t, testConfig())
	var msgs []any
	var out []turnUsage
	for _, s := range steps {
		msgs = append(msgs, map[string]any{"role": "user", "content": s.user})
		if s.call != "" {
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": s.call, "input": json.RawMessage(s.args)}}},
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": s.toolText}}})
		}
		r := createMessage(t, w, map[string]any{"system": system, "tools": []any{messagesWeatherTool()}, "tool_choice": map[string]any{"type": "none"},
			"max_tokens": 20, "ignore_eos": true, "messages": msgs})
		out = append(out, turnUsage{r.prompt(), r.Usage.CacheReadInputTokens, r.text()})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": r.text()}}})
	}
	return out
}

func TestSameConversationSameCacheAcrossChatResponsesAndMessages(t *testing.T) {
	system, steps := agentConversation()
	want := runChat(t, system, steps)
	for i := 1; i < len(want); i++ {
		if want[i].cached <= want[i-1].prompt {
			t.Fatalf("chat turn %d cached %d, not beyond the previous prompt %d: the conversation does not exercise the cache", i, want[i].cached, want[i-1].prompt)
		}
	}
	for _, api := range []struct {
		name string
		run  func() []turnUsage
	}{
		{"responses, full resend", func() []turnUsage { return runResponses(t, system, steps, false) }},
		{"responses, previous_response_id", func() []turnUsage { return runResponses(t, system, steps, true) }},
		{"messages", func() []turnUsage { return runMessages(t, system, steps) }},
	} {
		got := api.run()
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s, turn %d: prompt %d cached %d reply %q; chat: prompt %d cached %d reply %q",
					api.name, i, got[i].prompt, got[i].cached, got[i].reply, want[i].prompt, want[i].cached, want[i].reply)
			}
		}
	}
}

// TestSimToolCallsCacheAlikeInChatResponsesAndMessages runs a tool loop
// whose calls the simulator makes: the chat API (with tool_choice auto), the
// Responses API (full resend and chained) and the Messages API see the same
// prompts, hits and calls at every request.
func TestSimToolCallsCacheAlikeInChatResponsesAndMessages(t *testing.T) {
	const system = "You are an agent."
	tasks := []string{words("task0", 300), "now the second task", "and the third"}
	messages := func() []toolUsage {
		w := newWorker(t, fullReplies())
		var msgs []any
		return runToolLoop(t, "messages", tasks, func(task string) toolUsage {
			if task != "" {
				msgs = append(msgs, map[string]any{"role": "user", "content": task})
			}
			r := createMessage(t, w, map[string]any{"system": system, "tools": []any{messagesWeatherTool()}, "max_tokens": 48, "messages": msgs})
			u := toolUsage{prompt: r.prompt(), cached: r.Usage.CacheReadInputTokens}
			if r.StopReason != "tool_use" {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": r.text()})
				return u
			}
			c := r.Content[0]
			u.call = c.Name + compactJSON(t, c.Input)
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": c.Input}}},
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": c.ID, "content": "result"}}})
			return u
		})
	}

	chat := func() []toolUsage {
		w := newWorker(t, fullReplies())
		msgs := []any{map[string]any{"role": "system", "content": system}}
		return runToolLoop(t, "chat", tasks, func(task string) toolUsage {
			if task != "" {
				msgs = append(msgs, map[string]any{"role": "user", "content": task})
			}
			rec := do(t, w, "POST", "/v1/chat/completions", jsonBody(t, map[string]any{"messages": msgs,
				"tools": []any{chatWeatherTool()}, "tool_choice": "auto", "max_tokens": 48}))
			var r chatToolReply
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 || len(r.Choices) != 1 {
				t.Fatalf("chat: %d %s", rec.Code, rec.Body)
			}
			u := toolUsage{prompt: r.Usage.PromptTokens, cached: r.Usage.PromptTokensDetails.CachedTokens}
			if r.Choices[0].FinishReason != "tool_calls" {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": r.text(t)})
				return u
			}
			c := r.call(t)
			u.call = c.Function.Name + compactJSON(t, []byte(c.Function.Arguments))
			msgs = append(msgs, chatAssistantCall(c), chatToolResult(c, "result"))
			return u
		})
	}

	responses := func(chain bool) []toolUsage {
		w := newWorker(t, fullReplies())
		c := responsesClient{chain: chain}
		var turn []any // the items sent after the last response: the task, or a call's output
		return runToolLoop(t, "responses", tasks, func(task string) toolUsage {
			if task != "" {
				turn = append(turn, map[string]any{"role": "user", "content": task})
			}
			r := c.create(t, w, map[string]any{"instructions": system, "tools": []any{responsesWeatherTool()}, "max_output_tokens": 48}, turn)
			turn = nil
			u := toolUsage{prompt: r.Usage.InputTokens, cached: r.Usage.InputTokensDetails.CachedTokens}
			o := r.Output[0]
			if o.Type != "function_call" {
				c.answered(map[string]any{"role": "assistant", "content": r.text()})
				return u
			}
			u.call = o.Name + compactJSON(t, []byte(o.Arguments))
			c.answered(map[string]any{"type": "function_call", "call_id": o.CallID, "name": o.Name, "arguments": o.Arguments})
			turn = append(turn, map[string]any{"type": "function_call_output", "call_id": o.CallID, "output": "result"})
			return u
		})
	}

	want := messages()
	if len(want) != 6 {
		t.Fatalf("%d requests, want a call and an answer for each of 3 tasks: %+v", len(want), want)
	}
	for i := 1; i < len(want); i++ {
		if want[i].cached <= want[i-1].prompt {
			t.Fatalf("request %d cached %d, not beyond the previous prompt %d: the previous reply was not cached", i, want[i].cached, want[i-1].prompt)
		}
	}
	for _, chain := range []bool{false, true} {
		got := responses(chain)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("responses (chained %v):\n%+v\nmessages:\n%+v", chain, got, want)
		}
	}
	if got := chat(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("chat:\n%+v\nmessages:\n%+v", got, want)
	}
}

// The Responses and Messages routes answer only their methods.
func TestAgentRoutesMethods(t *testing.T) {
	w := newWorker(t, testConfig())
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/messages"}, {"GET", "/v1/responses"}, {"PUT", "/v1/responses/resp_1"}, {"GET", "/v1/responses/resp_1/cancel"},
	} {
		if rec := do(t, w, req.method, req.path, ""); rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want 405", req.method, req.path, rec.Code)
		}
	}
}

// toolUsage is what one request of a tool loop cost, and the call it made: its name and compacted
// arguments, or "" when the request was answered.
type toolUsage struct {
	prompt, cached int
	call           string
}

// runToolLoop drives one API's tool loop over tasks and returns each request's usage. For each
// task it calls send with the task, then with "" after each call send reports, until send
// reports an answer; a task still calling after 4 requests fails the test, as the loop would not
// end.
func runToolLoop(t *testing.T, api string, tasks []string, send func(task string) toolUsage) []toolUsage {
	t.Helper()
	var out []toolUsage
	for _, task := range tasks {
		for round := 0; ; round++ {
			if round == 4 {
				t.Fatalf("%s: the tool loop does not end: %+v", api, out)
			}
			u := send(task)
			out = append(out, u)
			if u.call == "" {
				break
			}
			task = ""
		}
	}
	return out
}

// compactJSON is a call's arguments compacted, so that calls compare alike whether a client got
// them as a string (chat, Responses) or as a parsed input (Messages).
func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		t.Fatalf("arguments %q: %v", b, err)
	}
	return c.String()
}
