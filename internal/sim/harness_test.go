package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Tests of what the agent harnesses (Claude Code, Codex CLI) need from the
// simulator with its default settings: the requests they send accepted,
// replies that end on their own, and tool calls that change nothing and let
// a conversation end.

// defaultConfig is DefaultConfig that never sleeps: the defaults a user of
// `cacheroute sim` gets, tool rule and output lengths included.
func defaultConfig() Config {
	cfg := DefaultConfig()
	cfg.TimeScale = 0
	return cfg
}

// claudeCodeTools are tools as Claude Code offers them: a sub-agent
// launcher, a shell, writers and one reader, in its order.
func claudeCodeTools() []any {
	tool := func(name string, required ...string) map[string]any {
		props := map[string]any{}
		for _, r := range required {
			props[r] = map[string]any{"type": "string"}
		}
		return map[string]any{"name": name, "description": name + " tool",
			"input_schema": map[string]any{"type": "object", "properties": props, "required": required}}
	}
	return []any{tool("Agent", "prompt"), tool("Bash", "command"), tool("Edit", "file_path"), tool("Read", "file_path"), tool("Write", "file_path", "content")}
}

func TestMessages_SystemMessageInsideMessagesRendersAsChatSystemMessage(t *testing.T) {
	w := newWorker(t, testConfig())
	// Claude Code sends its agent list so, for a model name it does not know.
	r := createMessage(t, w, map[string]any{"max_tokens": 8, "ignore_eos": true, "messages": []any{
		map[string]any{"role": "user", "content": "hi"},
		map[string]any{"role": "system", "content": []any{map[string]any{"type": "text", "text": "agents: none"}}},
	}})
	c := chatWith(t, w, map[string]any{"max_tokens": 8, "ignore_eos": true, "messages": []any{
		map[string]any{"role": "user", "content": "hi"},
		map[string]any{"role": "system", "content": "agents: none"},
	}})
	if r.prompt() != c.Usage.PromptTokens || r.text() != c.Choices[0].Message.Content {
		t.Fatalf("messages: %d prompt tokens %q; chat: %d %q: want the same rendering", r.prompt(), r.text(), c.Usage.PromptTokens, c.Choices[0].Message.Content)
	}
}

func TestMessages_AcceptsAndIgnoresClaudeCodeFields(t *testing.T) {
	w := newWorker(t, defaultConfig())
	plain := map[string]any{"model": "sim-model", "max_tokens": 32000, "stream": false,
		"system":   []any{map[string]any{"type": "text", "text": "You are an agent."}},
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "say hi"}}}},
		"tools":    claudeCodeTools()}
	full := map[string]any{}
	for k, v := range plain {
		full[k] = v
	}
	full["system"] = []any{map[string]any{"type": "text", "text": "You are an agent.", "cache_control": map[string]any{"type": "ephemeral"}}}
	full["messages"] = []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "say hi", "cache_control": map[string]any{"type": "ephemeral", "ttl": "1h"}}}}}
	full["metadata"] = map[string]any{"user_id": `{"session_id":"s1"}`}
	full["thinking"] = map[string]any{"type": "adaptive", "display": "omitted"}
	full["context_management"] = map[string]any{"edits": []any{map[string]any{"type": "clear_thinking_20251015", "keep": "all"}}}
	full["output_config"] = map[string]any{"effort": "high"}
	full["temperature"] = 1
	full["tools"] = append(claudeCodeTools(), map[string]any{"type": "web_search_20250305", "name": "web_search", "max_uses": 5})

	want := createMessage(t, w, plain)
	w.ResetPrefixCache()
	rec := do(t, w, http.MethodPost, "/v1/messages?beta=true", jsonBody(t, full))
	got := decodeOK[msgReply](t, rec)
	blocks := func(r msgReply) (s string) {
		for _, c := range r.Content {
			s += c.Type + c.Name + string(c.Input) + c.Text + "|"
		}
		return s
	}
	if got.prompt() != want.prompt() || blocks(got) != blocks(want) || got.StopReason != want.StopReason {
		t.Fatalf("with Claude Code's fields: %d prompt tokens %+v; without: %d %+v: want them ignored", got.prompt(), got.Content, want.prompt(), want.Content)
	}
}

func TestMessages_UnknownRoleIsRefusedInAnthropicShape(t *testing.T) {
	w := newWorker(t, testConfig())
	rec := do(t, w, http.MethodPost, "/v1/messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"tool","content":"y"}]}`)
	var e anthropicError
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != http.StatusBadRequest || e.Type != "error" ||
		e.Error.Type != "invalid_request_error" || !strings.HasPrefix(e.Error.Message, "messages.1.role: Input should be") {
		t.Fatalf("status %d %s, want 400 invalid_request_error on messages.1.role", rec.Code, rec.Body)
	}
}

func TestResponses_AcceptsAndIgnoresCodexFields(t *testing.T) {
	w := newWorker(t, defaultConfig())
	input := []any{
		map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "sandbox: read-only"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "say hi"}}},
	}
	fn := map[string]any{"type": "function", "name": "exec_command", "strict": false,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string"}}, "required": []string{"cmd"}}}
	plain := map[string]any{"model": "sim-model", "instructions": "You are Codex.", "input": input, "tools": []any{fn}, "max_output_tokens": 4000}
	full := map[string]any{}
	for k, v := range plain {
		full[k] = v
	}
	full["tools"] = []any{fn,
		map[string]any{"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents", "tools": []any{
			map[string]any{"type": "function", "name": "spawn_agent", "parameters": map[string]any{"type": "object"}}}},
		map[string]any{"type": "web_search", "external_web_access": false}}
	full["tool_choice"] = "auto"
	full["parallel_tool_calls"] = true
	full["reasoning"] = map[string]any{"effort": "medium", "summary": "auto"}
	full["store"] = false
	full["include"] = []string{"reasoning.encrypted_content"}
	full["prompt_cache_key"] = "01a2-session"
	full["client_metadata"] = map[string]any{"turn_id": "t1"}
	full["text"] = map[string]any{"verbosity": "low"}

	want := createResponse(t, w, plain)
	w.ResetPrefixCache()
	got := createResponse(t, w, full)
	if got.Usage.InputTokens != want.Usage.InputTokens || got.text() != want.text() || len(got.Output) != len(want.Output) {
		t.Fatalf("with Codex's fields: %d input tokens %+v; without: %d %+v: want them ignored", got.Usage.InputTokens, got.Output, want.Usage.InputTokens, want.Output)
	}
}

func TestReplyEndsNaturallyWellBeforeALargeMaxTokens(t *testing.T) {
	cfg := defaultConfig()
	w := newWorker(t, cfg)
	total, n := 0, 200
	for i := range n {
		r := createMessage(t, w, map[string]any{"max_tokens": 32000,
			"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("question %d", i)}}})
		if r.StopReason != "end_turn" {
			t.Fatalf("reply %d stopped with %q after %d tokens, want end_turn", i, r.StopReason, r.Usage.OutputTokens)
		}
		total += r.Usage.OutputTokens
	}
	if mean := total / n; mean < cfg.OutputLenMean/2 || mean > 2*cfg.OutputLenMean {
		t.Fatalf("mean reply length %d tokens over %d replies, want about --output-len-mean %d", mean, n, cfg.OutputLenMean)
	}
	c := chatWith(t, w, map[string]any{"max_tokens": 32000, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	if c.Choices[0].FinishReason != "stop" {
		t.Fatalf("chat finished with %q, want stop", c.Choices[0].FinishReason)
	}
}

func TestIgnoreEOSRunsToMaxTokens(t *testing.T) {
	w := newWorker(t, defaultConfig())
	r := createMessage(t, w, map[string]any{"max_tokens": 300, "ignore_eos": true,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	if r.StopReason != "max_tokens" || r.Usage.OutputTokens != 300 {
		t.Fatalf("ignore_eos: %q after %d tokens, want max_tokens after 300", r.StopReason, r.Usage.OutputTokens)
	}
}

func TestOutputLengthFollowsTheConfiguredDistribution(t *testing.T) {
	for _, dist := range []string{OutputLenFixed, OutputLenUniform, OutputLenExponential} {
		cfg := defaultConfig()
		cfg.OutputLenDist, cfg.OutputLenMean = dist, 20
		w := newWorker(t, cfg)
		lo, hi, total := 1<<30, 0, 0
		for i := range 300 {
			r := createMessage(t, w, map[string]any{"max_tokens": 1000,
				"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("q %d", i)}}})
			n := r.Usage.OutputTokens
			lo, hi, total = min(lo, n), max(hi, n), total+n
		}
		mean := float64(total) / 300
		switch dist {
		case OutputLenFixed:
			if lo != 20 || hi != 20 {
				t.Errorf("fixed: lengths %d..%d, want 20", lo, hi)
			}
		case OutputLenUniform:
			if lo < 1 || hi > 39 || mean < 17 || mean > 23 {
				t.Errorf("uniform: lengths %d..%d mean %.1f, want 1..39 about 20", lo, hi, mean)
			}
		case OutputLenExponential:
			// An exponential's spread: its standard deviation is its mean.
			if lo < 1 || hi < 40 || mean < 15 || mean > 25 {
				t.Errorf("exponential: lengths %d..%d mean %.1f, want a long tail about 20", lo, hi, mean)
			}
		}
	}
}

// toolLoop drives a Messages conversation as Claude Code does (each tool
// result goes back with a text reminder beside it in the same user message)
// until the reply is text, and returns the tools called, in order.
func toolLoop(t *testing.T, w *Worker, question string, tools []any, choice any) []string {
	t.Helper()
	msgs := []any{map[string]any{"role": "user", "content": question}}
	var called []string
	for range 50 {
		body := map[string]any{"max_tokens": 32000, "messages": msgs, "tools": tools}
		if choice != nil {
			body["tool_choice"] = choice
		}
		r := createMessage(t, w, body)
		if r.StopReason != "tool_use" {
			return called
		}
		c := r.Content[0]
		called = append(called, c.Name+string(c.Input))
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": c.Input}}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": c.ID, "content": "File does not exist."},
				map[string]any{"type": "text", "text": "<system-reminder>keep going</system-reminder>"}}})
	}
	t.Fatalf("%q: still calling tools after 50 rounds: %v", question, called)
	return nil
}

func TestDefaultToolRule_CallsOnlyAReadOnlyToolWithEmptyArguments(t *testing.T) {
	w := newWorker(t, defaultConfig())
	calls := 0
	for i := range 40 {
		for _, c := range toolLoop(t, w, fmt.Sprintf("task %d", i), claudeCodeTools(), nil) {
			calls++
			if c != `Read{"file_path":""}` {
				t.Fatalf("called %s, want only Read with an empty path", c)
			}
		}
	}
	if calls == 0 {
		t.Fatal("40 tasks with a reader offered made no call at all, want about one in two")
	}
}

func TestDefaultToolRule_NoCallWhenOnlyToolsThatActAreOffered(t *testing.T) {
	w := newWorker(t, defaultConfig())
	acting := claudeCodeTools()[:3] // Agent, Bash, Edit
	for i := range 20 {
		if c := toolLoop(t, w, fmt.Sprintf("task %d", i), acting, nil); len(c) != 0 {
			t.Fatalf("auto tool choice called %v, want text when no read-only tool is offered", c)
		}
	}
	// A tool choice that forces a call gets one, from all the tools.
	r := createMessage(t, w, map[string]any{"max_tokens": 100, "tools": acting, "tool_choice": map[string]any{"type": "any"},
		"messages": []any{map[string]any{"role": "user", "content": "go"}}})
	if r.StopReason != "tool_use" {
		t.Fatalf("tool_choice any: %q %+v, want a call", r.StopReason, r.Content)
	}
}

func TestDefaultToolRule_ConversationsEndAfterToolResults(t *testing.T) {
	cfg := defaultConfig()
	cfg.ToolCallRate = 1 // every user message gets a call; only the decay ends the loop
	w := newWorker(t, cfg)
	longest := 0
	for i := range 60 {
		c := toolLoop(t, w, fmt.Sprintf("task %d", i), claudeCodeTools(), nil)
		if len(c) == 0 {
			t.Fatalf("task %d: no call with --tool-call-rate 1", i)
		}
		longest = max(longest, len(c))
	}
	if longest < 2 {
		t.Fatalf("the longest loop made %d calls, want the decay to allow a second round sometimes", longest)
	}

	cfg.ToolCallDecay = 0
	w = newWorker(t, cfg)
	for i := range 20 {
		if c := toolLoop(t, w, fmt.Sprintf("task %d", i), claudeCodeTools(), nil); len(c) != 1 {
			t.Fatalf("--tool-call-decay 0: calls %v, want exactly one then text", c)
		}
	}
}

func TestToolRateZeroCallsOnlyWhenForced(t *testing.T) {
	cfg := defaultConfig()
	cfg.ToolCallRate = 0
	w := newWorker(t, cfg)
	for i := range 20 {
		if c := toolLoop(t, w, fmt.Sprintf("task %d", i), claudeCodeTools(), nil); len(c) != 0 {
			t.Fatalf("--tool-call-rate 0: calls %v, want none", c)
		}
	}
	r := createMessage(t, w, map[string]any{"max_tokens": 100, "tools": claudeCodeTools(), "tool_choice": map[string]any{"type": "tool", "name": "Bash"},
		"messages": []any{map[string]any{"role": "user", "content": "go"}}})
	if r.StopReason != "tool_use" || r.Content[0].Name != "Bash" {
		t.Fatalf("named tool_choice: %q %+v, want a Bash call", r.StopReason, r.Content)
	}
}

func TestReadOnlyToolNames(t *testing.T) {
	for name, want := range map[string]bool{
		"Read": true, "Glob": true, "Grep": true, "LS": true, "ListAgents": true, "get_goal": true, "view_image": true,
		"read_file": true, "Bash": false, "Write": false, "Edit": false, "Agent": false, "exec_command": false,
		"apply_patch": false, "WebFetch": false, "update_plan": false, "lsp": false,
		"search_replace": false, "get_and_delete": false, "list_and_run": false, "find_and_edit": false,
	} {
		if got := readOnlyTool(name); got != want {
			t.Errorf("readOnlyTool(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestConfigValidateRefusesBadReplyAndToolSettings(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"unknown distribution": func(c *Config) { c.OutputLenDist = "normal" },
		"zero mean":            func(c *Config) { c.OutputLenMean = 0 },
		"rate above one":       func(c *Config) { c.ToolCallRate = 1.5 },
		"negative decay":       func(c *Config) { c.ToolCallDecay = -0.1 },
		"unknown pick":         func(c *Config) { c.ToolPick = "write" },
	} {
		c := DefaultConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

// chatWith posts a chat request and decodes the 200 answer.
func chatWith(t *testing.T, h http.Handler, body map[string]any) chatReply {
	t.Helper()
	rec := do(t, h, http.MethodPost, "/v1/chat/completions", jsonBody(t, body))
	return decodeOK[chatReply](t, rec)
}
