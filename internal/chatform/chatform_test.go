package chatform

import (
	"strings"
	"testing"
)

// encoded is the chat a body converts to, as the router sends it to /tokenize.
func encoded(t *testing.T, c *Chat) string {
	t.Helper()
	m, tools, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return string(m) + " tools=" + string(tools)
}

func TestMessagesConvertAsVLLMConvertsThem(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"a string", `{"messages":[{"role":"user","content":"hi"}]}`,
			`[{"role":"user","content":"hi"}] tools=`},
		{"system string and blocks without the billing header",
			`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"A <b>"},{"type":"text","text":"B"}],"messages":[{"role":"user","content":"hi"}]}`,
			`[{"role":"system","content":"A <b>B"},{"role":"user","content":"hi"}] tools=`},
		{"one text block is a string, more are parts, empty texts dropped",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""}]},{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`,
			`[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}] tools=`},
		{"tool_use input as json.dumps writes it; an empty assistant message kept",
			`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"b":1.0,"a":"é"}},{"type":"tool_use","id":"t2","name":"g"}]},{"role":"assistant","content":[]}]}`,
			`[{"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{\"b\": 1.0, \"a\": \"\\u00e9\"}"}},{"id":"t2","type":"function","function":{"name":"g","arguments":"{}"}}]},{"role":"assistant"}] tools=`},
		{"tool results before the user's text; a user message of results only has no user message",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"l1"},{"type":"text","text":"l2"}]},{"type":"tool_result","tool_use_id":"t2"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t3","content":"r"}]}]}`,
			`[{"role":"tool","content":"l1\nl2","tool_call_id":"t1"},{"role":"tool","content":"","tool_call_id":"t2"},{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":"t3"}] tools=`},
		{"tools as chat functions",
			`{"tools":[{"name":"f","description":"d <x>","input_schema":{"type":"object"}},{"type":"custom","name":"g"}],"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"hi"}]}`,
			`[{"role":"user","content":"hi"}] tools=[{"type":"function","function":{"name":"f","description":"d <x>","parameters":{"type":"object"}}},{"type":"function","function":{"name":"g"}}]`},
		{"keys exact and the last of a repeated key",
			`{"messages":[{"role":"user","content":"old","Content":"no","content":"new"}]}`,
			`[{"role":"user","content":"new"}] tools=`},
	}
	for _, tt := range tests {
		c, err := Messages([]byte(tt.body))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := encoded(t, c); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}

func TestResponsesConvertAsVLLMConvertsThem(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"a string, with instructions", `{"instructions":"be <brief>","input":"hi"}`,
			`[{"role":"system","content":"be <brief>"},{"role":"user","content":"hi"}] tools=`},
		{"input_text parts are chat text parts", `{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},{"role":"developer","content":"d"}]}`,
			`[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"developer","content":"d"}] tools=`},
		{"an assistant message is its first part; calls join it",
			`{"input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"one"},{"type":"output_text","text":"two"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c1","output":"ok"}]}`,
			`[{"role":"assistant","content":"one","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","content":"ok","tool_call_id":"c1"}] tools=`},
		{"an assistant text fills a message of calls only before it",
			`{"input":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"role":"assistant","content":"after"},{"role":"assistant","content":"again"}]}`,
			`[{"role":"assistant","content":"after","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"assistant","content":"again"}] tools=`},
		{"function tools; strict is not rendered",
			`{"input":"hi","tools":[{"type":"function","name":"f","description":"","parameters":{"type":"object"},"strict":true}],"tool_choice":"auto"}`,
			`[{"role":"user","content":"hi"}] tools=[{"type":"function","function":{"name":"f","description":"","parameters":{"type":"object"}}}]`},
	}
	for _, tt := range tests {
		c, err := Responses([]byte(tt.body))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := encoded(t, c); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}

func TestWhatCannotRenderExactlyIsRefused(t *testing.T) {
	const user = `{"role":"user","content":"hi"}`
	messages := map[string]string{
		"an image":                  `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://127.0.0.1/x.png"}}]}]}`,
		"a document":                `{"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","data":"d"}}]}]}`,
		"thinking":                  `{"messages":[` + user + `,{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"}]}]}`,
		"a server tool":             `{"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[` + user + `]}`,
		"a server tool block":       `{"messages":[` + user + `,{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]}]}`,
		"a system message inline":   `{"messages":[` + user + `,{"role":"system","content":"note"}]}`,
		"an image in a result":      `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}]}`,
		"a tool_use without id":     `{"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`,
		"tools, tool_choice none":   `{"tools":[{"name":"f"}],"tool_choice":{"type":"none"},"messages":[` + user + `]}`,
		"chat_template_kwargs":      `{"chat_template_kwargs":{"enable_thinking":false},"messages":[` + user + `]}`,
		"a system image block":      `{"system":[{"type":"image","source":{"type":"url","url":"http://127.0.0.1/x.png"}}],"messages":[` + user + `]}`,
		"a tool with defer_loading": `{"tools":[{"name":"f","defer_loading":true}],"messages":[` + user + `]}`,
		"no messages":               `{"messages":[]}`,
	}
	for name, body := range messages {
		if c, err := Messages([]byte(body)); err == nil {
			t.Errorf("messages, %s: converted to %s", name, encoded(t, c))
		} else if !strings.Contains(err.Error(), "not rendered exactly") {
			t.Errorf("messages, %s: %v", name, err)
		}
	}
	responses := map[string]string{
		"an input image":          `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://127.0.0.1/x.png"}]}]}`,
		"an input file":           `{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`,
		"a reasoning item":        `{"input":[{"role":"user","content":"hi"},{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]}]}`,
		"a built-in tool":         `{"input":"hi","tools":[{"type":"web_search"}]}`,
		"a built-in call":         `{"input":[{"type":"web_search_call","id":"w","status":"completed"}]}`,
		"an item reference":       `{"input":[{"type":"item_reference","id":"msg_1"}]}`,
		"a partial last message":  `{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"par"}]}]}`,
		"a previous response":     `{"previous_response_id":"resp_1","input":"hi"}`,
		"a refusal":               `{"input":[{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`,
		"a namespaced call":       `{"input":[{"type":"function_call","call_id":"c","name":"f","namespace":"ns","arguments":"{}"}]}`,
		"tools, tool_choice none": `{"input":"hi","tools":[{"type":"function","name":"f"}],"tool_choice":"none"}`,
		"an unknown role":         `{"input":[{"role":"critic","content":"hi"}]}`,
	}
	for name, body := range responses {
		if c, err := Responses([]byte(body)); err == nil {
			t.Errorf("responses, %s: converted to %s", name, encoded(t, c))
		} else if !strings.Contains(err.Error(), "not rendered exactly") {
			t.Errorf("responses, %s: %v", name, err)
		}
	}
}
