package sim

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// agentBodies are Responses and Messages bodies that the router converts to chats for /tokenize
// (protocol.Request.TokenizeBody), one for every shape it takes: tools, instructions and systems,
// text parts, calls and their results.
var agentBodies = []struct {
	name, api, body string
}{
	{"responses, a string", "responses", `{"model":"m","input":"Hello there"}`},
	{"responses, everything", "responses", `{"model":"m","instructions":"Be <terse> & kind.",
		"tools":[{"type":"function","name":"get_weather","description":"Weather <by> city","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},
		         {"type":"function","name":"noop","description":""},{"type":"function","name":"bare"}],
		"input":[{"role":"developer","content":"dev note"},
		         {"type":"message","role":"user","content":[{"type":"input_text","text":"part one "},{"type":"input_text","text":"part two"}]},
		         {"type":"message","role":"assistant","content":[{"type":"output_text","text":"first"},{"type":"output_text","text":" dropped"}]},
		         {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		         {"type":"function_call","call_id":"c2","name":"noop","arguments":"{}"},
		         {"type":"function_call_output","call_id":"c1","output":"sunny"},
		         {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"ok"}]},
		         {"type":"function_call","call_id":"c3","name":"bare","arguments":"{}"},
		         {"type":"message","role":"assistant","content":"after the call"},
		         {"role":"user","content":"thanks"}]}`},
	{"messages, a string", "messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"Hello there"}]}`},
	{"messages, everything", "messages", `{"model":"m","max_tokens":5,
		"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=abc;"},{"type":"text","text":"You are <Claude>."},{"type":"text","text":" Be brief."}],
		"tools":[{"name":"get_weather","description":"Weather <by> city","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},{"name":"noop","type":"custom"}],
		"messages":[{"role":"user","content":[{"type":"text","text":"one "},{"type":"text","text":""},{"type":"text","text":"two"}]},
		            {"role":"assistant","content":[{"type":"text","text":"calling"},{"type":"redacted_thinking","data":"x"},
		                 {"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Zürich","n":1.0,"deep":{"a":[1,2]}}},
		                 {"type":"tool_use","id":"t2","name":"noop","input":{}}]},
		            {"role":"user","content":[{"type":"text","text":"before "},{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"line 1"},{"type":"text","text":"line 2"}]},
		                 {"type":"tool_result","tool_use_id":"t2","content":"done"},{"type":"text","text":"after"}]},
		            {"role":"assistant","content":[]},
		            {"role":"user","content":[{"type":"tool_result","tool_use_id":"t9"}]}]}`},
}

// The tokens /tokenize gives for the chat the router converts a Responses or Messages body to are
// the very tokens the simulator renders, caches and publishes for that body.
func TestConvertedChatTokenizesAsTheSimRendersTheBody(t *testing.T) {
	w := newWorker(t, testConfig())
	for _, tt := range agentBodies {
		var native prompt.Sequence
		var routed *protocol.Request
		var err error
		switch tt.api {
		case "responses":
			routed, err = protocol.ParseResponses(nil, []byte(tt.body))
			var req responsesRequest
			mustDecode(t, tt.body, &req)
			items, _, perr := parseResponsesInput(req.Input)
			tools, _, _, terr := responsesTools(req.Tools)
			msgs, _, cerr := responsesConversation(req.Instructions, nil, items)
			if perr != nil || terr != nil || cerr != nil {
				t.Fatalf("%s: the sim refuses it: %v %v %v", tt.name, perr, terr, cerr)
			}
			prompt.RenderChat(&native, tools, msgs, true)
		case "messages":
			routed, err = protocol.ParseMessages(nil, []byte(tt.body))
			var req messagesRequest
			mustDecode(t, tt.body, &req)
			msgs, merr := req.conversation()
			tools, _, terr := anthropicTools(req.Tools)
			if merr != nil || terr != nil {
				t.Fatalf("%s: the sim refuses it: %v %v", tt.name, merr, terr)
			}
			prompt.RenderChat(&native, tools, msgs, true)
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		ask, ok := routed.AppendTokenizeBody(nil, []byte(tt.body), w.cfg.Models[0])
		if !ok {
			t.Fatalf("%s: not converted", tt.name)
		}
		rec := do(t, w, "POST", "/tokenize", string(ask))
		var got tokenizeResponse
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &got) != nil {
			t.Fatalf("%s: /tokenize answered %d %s", tt.name, rec.Code, rec.Body)
		}
		want := native.AppendIDs(nil, 0, native.Len())
		if !slices.Equal(got.Tokens, want) {
			var chatSeq prompt.Sequence
			var creq chatRequest
			mustDecode(t, string(ask), &creq)
			_ = renderChatRequest(&chatSeq, &creq, true)
			t.Errorf("%s: /tokenize gives %d tokens, the sim renders %d:\n tokenize %q\n sim      %q", tt.name, len(got.Tokens), len(want), chatSeq.Text, native.Text)
		}
	}
}

func mustDecode(t *testing.T, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
}
