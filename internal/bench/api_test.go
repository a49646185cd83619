package bench

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// testTools is a chat tools array of two functions, the form workloads keep tools in.
const testTools = `[{"type":"function","function":{"name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}},` +
	`{"type":"function","function":{"name":"run_tests","description":"Run the tests.","parameters":{"type":"object"}}}]`

// agentTurn is the third turn of an agent session: the system prompt, the task, the server's
// first reply, a tool result, the second reply and the new tool result (this turn's own).
func agentTurn() []turnMessage {
	return plain(
		Message{"system", "You are a coding agent."},
		Message{"user", "Task 1: fix the build."},
		Message{"assistant", "I will read the file."},
		Message{"user", "Result of read_file (turn 1): ..."},
		Message{"assistant", "Now the tests."},
		Message{"user", "Result of run_tests (turn 2): ok"},
	)
}

// plain is msgs as a conversation without tool calls.
func plain(msgs ...Message) []turnMessage {
	out := make([]turnMessage, len(msgs))
	for i, m := range msgs {
		out[i] = turnMessage{Message: m}
	}
	return out
}

// encode builds the exchange of msgs (the last message this turn's own) through name's API,
// with its tools converted, and returns the body as generic JSON and the request's headers.
func encode(t *testing.T, name string, msgs []turnMessage, sessionID, mode, previousID string) (map[string]any, http.Header) {
	t.Helper()
	a, err := apiFor(name)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := a.tools(json.RawMessage(testTools))
	if err != nil {
		t.Fatal(err)
	}
	x := exchange{model: "m", msgs: msgs, fresh: len(msgs) - 1, tools: tools, maxTokens: 64,
		sessionID: sessionID, mode: mode, previousID: previousID}
	b, err := json.Marshal(a.body(&x))
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	a.header(h, &x)
	return out, h
}

// jsonOf re-reads a Go literal as generic JSON, for comparison with a decoded body.
func jsonOf(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

func wantField(t *testing.T, body map[string]any, key string, want any) {
	t.Helper()
	if got := body[key]; !reflect.DeepEqual(got, want) {
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		t.Errorf("%s = %s, want %s", key, gb, wb)
	}
}

func TestChatTurnResendsTheConversationWithChatTools(t *testing.T) {
	body, h := encode(t, APIChat, agentTurn(), "s@x", SessionBody, "")
	if msgs := body["messages"].([]any); len(msgs) != 6 {
		t.Fatalf("%d messages", len(msgs))
	}
	wantField(t, body, "tools", jsonOf(t, testTools))
	wantField(t, body, "max_tokens", 64.0)
	wantField(t, body, "stream", true)
	wantField(t, body, "stream_options", jsonOf(t, `{"include_usage":true}`))
	wantField(t, body, "session_params", jsonOf(t, `{"session_id":"s@x"}`))
	if h.Get(headerSessionID) != "" {
		t.Errorf("body mode sent header %q", h.Get(headerSessionID))
	}
}

func TestResponsesTurnResendsEverythingWithInstructionsAndFlatTools(t *testing.T) {
	body, h := encode(t, APIResponses, agentTurn(), "s@x", SessionHeader, "")
	wantField(t, body, "instructions", "You are a coding agent.")
	wantField(t, body, "input", jsonOf(t, `[
		{"type":"message","role":"user","content":"Task 1: fix the build."},
		{"type":"message","role":"assistant","content":"I will read the file."},
		{"type":"message","role":"user","content":"Result of read_file (turn 1): ..."},
		{"type":"message","role":"assistant","content":"Now the tests."},
		{"type":"message","role":"user","content":"Result of run_tests (turn 2): ok"}]`))
	wantField(t, body, "tools", jsonOf(t, `[
		{"type":"function","name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},
		{"type":"function","name":"run_tests","description":"Run the tests.","parameters":{"type":"object"}}]`))
	wantField(t, body, "max_output_tokens", 64.0)
	wantField(t, body, "stream", true)
	wantField(t, body, "store", false)
	wantField(t, body, "prompt_cache_key", "s@x")
	for _, absent := range []string{"previous_response_id", "messages", "max_tokens", "session_params", "stream_options"} {
		if _, ok := body[absent]; ok {
			t.Errorf("body has %q", absent)
		}
	}
	if h.Get(headerSessionID) != "s@x" {
		t.Errorf("header mode: x-session-id %q", h.Get(headerSessionID))
	}
}

func TestResponsesSessionIDsFollowTheSessionMode(t *testing.T) {
	body, h := encode(t, APIResponses, agentTurn(), "s@x", SessionBody, "")
	if body["prompt_cache_key"] != "s@x" || h.Get(headerSessionID) != "" {
		t.Errorf("body mode: prompt_cache_key %v, header %q", body["prompt_cache_key"], h.Get(headerSessionID))
	}
	body, h = encode(t, APIResponses, agentTurn(), "", SessionNone, "")
	if _, ok := body["prompt_cache_key"]; ok || len(h) != 0 {
		t.Errorf("none mode: prompt_cache_key %v, headers %v", body["prompt_cache_key"], h)
	}
}

func TestResponsesChainSendsOnlyTheNewInputAfterThePreviousResponse(t *testing.T) {
	body, _ := encode(t, APIResponsesChain, agentTurn(), "s@x", SessionHeader, "resp_2")
	wantField(t, body, "previous_response_id", "resp_2")
	wantField(t, body, "input", jsonOf(t, `[{"type":"message","role":"user","content":"Result of run_tests (turn 2): ok"}]`))
	wantField(t, body, "store", true)
	// A response does not carry its instructions or tools over: every turn sends them.
	wantField(t, body, "instructions", "You are a coding agent.")
	if tools, _ := body["tools"].([]any); len(tools) != 2 {
		t.Errorf("tools %v", body["tools"])
	}
	wantField(t, body, "prompt_cache_key", "s@x")

	first := agentTurn()[:2]
	body, _ = encode(t, APIResponsesChain, first, "s@x", SessionHeader, "")
	if _, ok := body["previous_response_id"]; ok {
		t.Error("first turn names a previous response")
	}
	wantField(t, body, "instructions", "You are a coding agent.")
	wantField(t, body, "input", jsonOf(t, `[{"type":"message","role":"user","content":"Task 1: fix the build."}]`))
	wantField(t, body, "store", true)
}

func TestMessagesTurnHasSystemApartAndAnthropicTools(t *testing.T) {
	body, h := encode(t, APIMessages, agentTurn(), "s@x", SessionHeader, "")
	wantField(t, body, "system", "You are a coding agent.")
	wantField(t, body, "messages", jsonOf(t, `[
		{"role":"user","content":"Task 1: fix the build."},
		{"role":"assistant","content":"I will read the file."},
		{"role":"user","content":"Result of read_file (turn 1): ..."},
		{"role":"assistant","content":"Now the tests."},
		{"role":"user","content":"Result of run_tests (turn 2): ok"}]`))
	wantField(t, body, "tools", jsonOf(t, `[
		{"name":"read_file","description":"Read a file.","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},
		{"name":"run_tests","description":"Run the tests.","input_schema":{"type":"object"}}]`))
	wantField(t, body, "max_tokens", 64.0)
	wantField(t, body, "stream", true)
	wantField(t, body, "metadata", jsonOf(t, `{"user_id":"s@x"}`))
	for _, absent := range []string{"stream_options", "session_params", "input", "instructions"} {
		if _, ok := body[absent]; ok {
			t.Errorf("body has %q", absent)
		}
	}
	if h.Get(headerClaudeSessionID) != "s@x" || h.Get(headerSessionID) != "" || h.Get("anthropic-version") == "" {
		t.Errorf("headers %v", h)
	}

	body, h = encode(t, APIMessages, agentTurn(), "s@x", SessionBody, "")
	if body["metadata"] == nil || h.Get(headerClaudeSessionID) != "" {
		t.Errorf("body mode: metadata %v, headers %v", body["metadata"], h)
	}
	body, h = encode(t, APIMessages, agentTurn(), "", SessionNone, "")
	if _, ok := body["metadata"]; ok || h.Get(headerClaudeSessionID) != "" {
		t.Errorf("none mode: metadata %v, headers %v", body["metadata"], h)
	}
}

// Anthropic's user and assistant turns alternate: messages of one role in a row (a Mooncake
// replay's blocks, a conversation's tool output) become one message of text blocks.
func TestMessagesMergesConsecutiveMessagesOfOneRoleIntoBlocks(t *testing.T) {
	msgs := plain(Message{"user", "block 1"}, Message{"user", "block 2"}, Message{"tool", "output"}, Message{"assistant", "ok"}, Message{"user", "next"})
	body, _ := encode(t, APIMessages, msgs, "", SessionNone, "")
	wantField(t, body, "messages", jsonOf(t, `[
		{"role":"user","content":[{"type":"text","text":"block 1"},{"type":"text","text":"block 2"},{"type":"text","text":"output"}]},
		{"role":"assistant","content":"ok"},
		{"role":"user","content":"next"}]`))
	if _, ok := body["system"]; ok {
		t.Error("system without a system message")
	}
}

func TestToolsThatAreNotFunctionsAreRefused(t *testing.T) {
	for _, name := range []string{APIResponses, APIMessages} {
		a, _ := apiFor(name)
		if _, err := a.tools(json.RawMessage(`[{"type":"web_search"}]`)); err == nil {
			t.Errorf("%s: a non-function tool converted", name)
		}
		if got, err := a.tools(nil); err != nil || got != nil {
			t.Errorf("%s: no tools gave %s, %v", name, got, err)
		}
	}
	if _, err := apiFor("completions"); err == nil {
		t.Error("unknown API accepted")
	}
}

// parse runs a whole SSE stream through name's event reader.
func parse(t *testing.T, name, sse string) (*stream, error) {
	t.Helper()
	a, err := apiFor(name)
	if err != nil {
		t.Fatal(err)
	}
	st := &stream{}
	err = readEvents(strings.NewReader(sse), func(data []byte) (bool, error) {
		if err := a.event(data, st); err != nil {
			return false, err
		}
		return st.done, nil
	})
	return st, err
}

func TestChatStreamUsage(t *testing.T) {
	st, err := parse(t, APIChat, `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}

data: {"choices":[{"delta":{"content":"Hel"}}]}

data: {"choices":[{"delta":{"content":"lo"}}]}

data: {"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":96}}}

data: [DONE]

`)
	if err != nil || !st.done || !st.content || st.reply.String() != "Hello" || st.prompt != 120 || st.cached != 96 || st.output != 2 {
		t.Fatalf("err %v, stream %+v reply %q", err, st, st.reply.String())
	}
}

// A Responses stream as OpenAI sends it: named events whose data repeats the type; usage
// arrives with response.completed, where input_tokens counts the cached tokens too.
const responsesSSE = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_7","object":"response","status":"in_progress","output":[],"usage":null}}

event: response.in_progress
data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_7","status":"in_progress","usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}

event: response.content_part.added
data: {"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hel"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"lo"}

event: response.output_text.done
data: {"type":"response.output_text.done","sequence_number":6,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello"}

event: response.completed
data: {"type":"response.completed","sequence_number":7,"response":{"id":"resp_7","status":"completed","output":[{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]}],"usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1408},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1502}}}

`

func TestResponsesStreamUsage(t *testing.T) {
	st, err := parse(t, APIResponses, responsesSSE)
	if err != nil || !st.done || !st.content || st.reply.String() != "Hello" || st.responseID != "resp_7" {
		t.Fatalf("err %v, stream %+v reply %q", err, st, st.reply.String())
	}
	if st.prompt != 1500 || st.cached != 1408 || st.output != 2 {
		t.Fatalf("prompt %d cached %d output %d, want 1500 1408 2", st.prompt, st.cached, st.output)
	}
}

func TestResponsesStreamEndsOnIncompleteAndFailsOnFailed(t *testing.T) {
	st, err := parse(t, APIResponses, `data: {"type":"response.incomplete","response":{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":10,"output_tokens":4}}}`+"\n\n")
	if err != nil || !st.done || st.prompt != 10 || st.output != 4 {
		t.Fatalf("incomplete: err %v, %+v", err, st)
	}
	_, err = parse(t, APIResponses, `data: {"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_error","message":"boom"}}}`+"\n\n")
	if err == nil || !strings.Contains(err.Error(), "server_error: boom") {
		t.Fatalf("failed: %v", err)
	}
	_, err = parse(t, APIResponses, `data: {"type":"error","code":"rate_limit_exceeded","message":"slow down"}`+"\n\n")
	if err == nil || !strings.Contains(err.Error(), "slow down") {
		t.Fatalf("error event: %v", err)
	}
}

// A Messages stream as Anthropic sends it. input_tokens leaves out the cache: the prompt is
// input_tokens + cache_read_input_tokens + cache_creation_input_tokens, and the cached part is
// the cache reads, so the hit rate means what it means for chat.
const messagesSSE = "event: message_start\r\n" +
	`data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":80,"cache_read_input_tokens":1408,"output_tokens":1}}}` + "\r\n\r\n" +
	`event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

`

func TestMessagesStreamUsageCountsCacheReadsInThePrompt(t *testing.T) {
	st, err := parse(t, APIMessages, messagesSSE)
	if err != nil || !st.done || !st.content || st.reply.String() != "Hello" || st.responseID != "msg_01" {
		t.Fatalf("err %v, stream %+v reply %q", err, st, st.reply.String())
	}
	if st.prompt != 12+80+1408 || st.cached != 1408 || st.output != 2 {
		t.Fatalf("prompt %d cached %d output %d, want 1500 1408 2", st.prompt, st.cached, st.output)
	}
}

// message_delta's usage is cumulative and may restate the input counts; what it gives wins.
func TestMessagesDeltaUsageOverridesTheStart(t *testing.T) {
	st, err := parse(t, APIMessages, `data: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":5,"cache_read_input_tokens":0,"output_tokens":1}}}

data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":20,"cache_read_input_tokens":100,"output_tokens":8}}

data: {"type":"message_stop"}

`)
	if err != nil || st.prompt != 120 || st.cached != 100 || st.output != 8 || st.content {
		t.Fatalf("err %v, %+v", err, st)
	}
}

func TestMessagesErrorEventFails(t *testing.T) {
	_, err := parse(t, APIMessages, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	if err == nil || !strings.Contains(err.Error(), "overloaded_error: Overloaded") {
		t.Fatalf("%v", err)
	}
}

// SSE framing: an event's data lines are joined by newlines, comments and other fields are
// skipped, and a last event without its blank line still counts.
func TestReadEventsFramesServerSentEvents(t *testing.T) {
	var got []string
	err := readEvents(strings.NewReader(": comment\nevent: x\nid: 1\ndata: {\"a\":\ndata:1}\n\nretry: 5\ndata: last"), func(d []byte) (bool, error) {
		got = append(got, string(d))
		return false, nil
	})
	if err != nil || !reflect.DeepEqual(got, []string{"{\"a\":\n1}", "last"}) {
		t.Fatalf("%q %v", got, err)
	}
	// An event larger than the reader's buffer.
	big := strings.Repeat("x", 200<<10)
	got = nil
	err = readEvents(strings.NewReader("data: "+big+"\n\n"), func(d []byte) (bool, error) {
		got = append(got, string(d))
		return true, nil
	})
	if err != nil || len(got) != 1 || got[0] != big {
		t.Fatalf("big event: %d events, %v", len(got), err)
	}
}

// A server that answers with a tool call gets the call's result in the next turn: the turn's
// first user message (workloads write tool results as user messages) answers the first call,
// and every other call gets an empty result.
func TestAToolCallReplyIsAnsweredByTheNextTurnsFirstUserMessage(t *testing.T) {
	var conv conversation
	conv.next(&Turn{Append: []Message{{"system", "s"}, {"user", "task"}}})
	conv.reply("", []ToolCall{{ID: "call_1", Name: "read_file", Arguments: `{"path":"a"}`}, {ID: "call_2", Name: "grep"}})
	msgs, fresh := conv.next(&Turn{Append: []Message{{"user", "Result of read_file"}, {"user", "and more"}}})
	if len(msgs) != 6 || fresh != 3 {
		t.Fatalf("%d messages: %+v", len(msgs), msgs)
	}
	if m := msgs[3]; m.Role != "tool" || m.callID != "call_1" || m.Content != "Result of read_file" {
		t.Fatalf("first result %+v", m)
	}
	if m := msgs[4]; m.Role != "tool" || m.callID != "call_2" || m.Content != "" {
		t.Fatalf("second result %+v", m)
	}
	if m := msgs[5]; m.Role != "user" || m.callID != "" || m.Content != "and more" {
		t.Fatalf("after the results %+v", m)
	}
	// A text reply leaves the next turn's user message a user message.
	conv.reply("text", nil)
	msgs, _ = conv.next(&Turn{Append: []Message{{"user", "next"}}})
	if m := msgs[len(msgs)-1]; m.Role != "user" || m.callID != "" {
		t.Fatalf("after a text reply %+v", m)
	}
}

// toolTurn is a conversation whose first reply called read_file and whose third turn follows a
// text answer to the call's result.
func toolTurn() []turnMessage {
	msgs := plain(Message{"system", "sys"}, Message{"user", "task"})
	msgs = append(msgs, turnMessage{Message: Message{Role: "assistant"}, calls: []ToolCall{{ID: "call_9", Name: "read_file", Arguments: `{"path":"x"}`}}})
	msgs = append(msgs, turnMessage{Message: Message{Role: "tool", Content: "file body"}, callID: "call_9"})
	return append(msgs, plain(Message{"assistant", "read it"}, Message{"user", "now fix it"})...)
}

func TestResponsesResendsToolCallsAndTheirOutputsAsItems(t *testing.T) {
	body, _ := encode(t, APIResponses, toolTurn(), "", SessionNone, "")
	wantField(t, body, "input", jsonOf(t, `[
		{"type":"message","role":"user","content":"task"},
		{"type":"function_call","call_id":"call_9","name":"read_file","arguments":"{\"path\":\"x\"}"},
		{"type":"function_call_output","call_id":"call_9","output":"file body"},
		{"type":"message","role":"assistant","content":"read it"},
		{"type":"message","role":"user","content":"now fix it"}]`))

	// Chained, the turn after a call sends its output alone: the call is in the stored response.
	msgs := toolTurn()[:4]
	x := exchange{model: "m", msgs: msgs, fresh: 3, previousID: "resp_1", maxTokens: 8}
	b, _ := json.Marshal(responsesAPI{chain: true}.body(&x))
	var got map[string]any
	_ = json.Unmarshal(b, &got)
	wantField(t, got, "input", jsonOf(t, `[{"type":"function_call_output","call_id":"call_9","output":"file body"}]`))
}

func TestMessagesResendsToolUseAndToolResultBlocks(t *testing.T) {
	msgs := toolTurn()
	msgs[2].Content = "Reading."
	msgs = append(msgs[:4:4], append(plain(Message{"user", "also this"}), msgs[4:]...)...)
	body, _ := encode(t, APIMessages, msgs, "", SessionNone, "")
	wantField(t, body, "messages", jsonOf(t, `[
		{"role":"user","content":"task"},
		{"role":"assistant","content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"call_9","name":"read_file","input":{"path":"x"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_9","content":"file body"},{"type":"text","text":"also this"}]},
		{"role":"assistant","content":"read it"},
		{"role":"user","content":"now fix it"}]`))
}

func TestResponsesStreamKeepsTheFunctionCall(t *testing.T) {
	st, err := parse(t, APIResponses, `event: response.created
data: {"type":"response.created","response":{"id":"resp_3","usage":null}}

event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_3","name":"grep","arguments":"","status":"in_progress"}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"path\":"}

event: response.function_call_arguments.done
data: {"type":"response.function_call_arguments.done","item_id":"fc_1","output_index":0,"arguments":"{\"path\":\"y\"}"}

event: response.output_item.done
data: {"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_3","name":"grep","arguments":"{\"path\":\"y\"}","status":"completed"}}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_3","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":16},"output_tokens":6}}}

`)
	if err != nil || !st.done || !st.content || st.reply.String() != "" || st.prompt != 50 || st.cached != 16 {
		t.Fatalf("err %v, %+v", err, st)
	}
	if !reflect.DeepEqual(st.calls, []ToolCall{{ID: "call_3", Name: "grep", Arguments: `{"path":"y"}`}}) {
		t.Fatalf("calls %+v", st.calls)
	}
}

func TestMessagesStreamAssemblesToolUseInput(t *testing.T) {
	st, err := parse(t, APIMessages, `data: {"type":"message_start","message":{"id":"msg_2","usage":{"input_tokens":4,"cache_read_input_tokens":32,"cache_creation_input_tokens":0,"output_tokens":1}}}

data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me look."}}

data: {"type":"content_block_stop","index":0}

data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"read_file","input":{}}}

data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\": "}}

data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"a.go\"}"}}

data: {"type":"content_block_stop","index":1}

data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_2","name":"list_dir","input":{}}}

data: {"type":"content_block_stop","index":2}

data: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":20}}

data: {"type":"message_stop"}

`)
	if err != nil || !st.done || st.reply.String() != "Let me look." || st.prompt != 36 || st.cached != 32 || st.output != 20 {
		t.Fatalf("err %v, %+v", err, st)
	}
	want := []ToolCall{{ID: "toolu_1", Name: "read_file", Arguments: `{"path": "a.go"}`}, {ID: "toolu_2", Name: "list_dir", Arguments: `{}`}}
	if !reflect.DeepEqual(st.calls, want) {
		t.Fatalf("calls %+v", st.calls)
	}
}

// A tool call's first token is its name: the event that opens a function_call item or a
// tool_use block carries content, as a chat stream's first tool_calls delta does.
func TestAToolCallsNameIsItsFirstContent(t *testing.T) {
	st, _ := parse(t, APIResponses, `data: {"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","call_id":"c","name":"grep","arguments":""}}`+"\n\n")
	if !st.content {
		t.Error("responses: the function_call item did not count as content")
	}
	st, _ = parse(t, APIResponses, `data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","role":"assistant","content":[]}}`+"\n\n")
	if st.content {
		t.Error("responses: an empty message item counted as content")
	}
	st, _ = parse(t, APIMessages, `data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"grep","input":{}}}`+"\n\n")
	if !st.content {
		t.Error("messages: the tool_use block did not count as content")
	}
	st, _ = parse(t, APIMessages, `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`+"\n\n")
	if st.content {
		t.Error("messages: an empty text block counted as content")
	}
}
