package protocol_test

import (
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// keyAs is the history key of the body of p.
func keyAs(t testing.TB, p *agentProtocol, body string) string {
	t.Helper()
	r := mustParseAs(t, p, nil, body)
	if !r.Chat {
		t.Fatalf("%s(%s): no conversation", p.name, body)
	}
	return r.Text
}

// The key's framing, spelled out: each kind of tool, item and block.
func TestResponsesKeyFraming(t *testing.T) {
	body := `{"instructions":"be brief",
		"tools":[{"type":"function","name":"run","description":"Run it","parameters":{"b":1,"a":2},"strict":true},{"type":"web_search"}],
		"input":[
			{"role":"user","content":"hi"},
			{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hello","annotations":[]},{"type":"refusal","refusal":"no"}]},
			{"type":"function_call","id":"fc_1","call_id":"c1","name":"run","arguments":"{}"},
			{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"ok"},{"type":"input_image","image_url":"u"}]},
			{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"why"}],"content":[{"type":"reasoning_text","text":"how"}],"encrypted_content":"enc"},
			{"type":"item_reference","id":"r1"},
			{"role":"tool","content":"t"}]}`
	want := spelled(`W{"type":"web_search"}·` + `Trun·Run it·{"a":2,"b":1}·` + `scbe brief·.` + `uchi·.` + `achello·xno·.` +
		`fc1·run·{}·.` + `oc1·cok·.` + `zywhy·khow·eenc·.` + `J{"id":"r1","type":"item_reference"}·.` + `tct·.`)
	if got := keyAs(t, &responsesProtocol, body); got != want {
		t.Errorf("key\n%q\nwant\n%q", got, want)
	}
	if got := keyAs(t, &responsesProtocol, `{"input":"hi there"}`); got != spelled("uchi there·.") {
		t.Errorf("a string input gave %q", got)
	}
}

func TestMessagesKeyFraming(t *testing.T) {
	body := `{"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],
		"tools":[{"name":"run","description":"Run it","input_schema":{"b":1,"a":2}},{"type":"web_search_20250305","name":"web_search","max_uses":5}],
		"messages":[
			{"role":"user","content":"hi"},
			{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"redacted_thinking","data":"enc"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"run","input":{"cmd":"ls"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"x"},{"type":"image","source":{}}]},{"type":"document","source":{}},{"type":"search_result","title":"T"}]}]}`
	want := spelled(`Trun·Run it·{"a":2,"b":1}·` + `W{"max_uses":5,"name":"web_search","type":"web_search_20250305"}·` + `scbe brief·.` + `uchi·.` +
		`akhmm·eenc·cok·ft1·run·{"cmd":"ls"}·.` + `uot1·cx·!J{"title":"T","type":"search_result"}·.`)
	if got := keyAs(t, &messagesProtocol, body); got != want {
		t.Errorf("key\n%q\nwant\n%q", got, want)
	}
}

// Shapes that say the same thing to the model give the same key: the short and long forms of an
// item or a block, fields the prompt does not hold, the order of tools and of schema members.
func TestAgentKeyOfEquivalentShapes(t *testing.T) {
	groups := []struct {
		p      *agentProtocol
		name   string
		bodies []string
	}{
		{&responsesProtocol, "a user message", []string{
			`{"input":"hi"}`,
			`{"input":[{"role":"user","content":"hi"}]}`,
			`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}`,
			`{"input":[{"type":"message","id":"msg_9","status":"completed","role":"user","content":[{"text":"hi"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"auto"}]}]}`,
		}},
		{&responsesProtocol, "an assistant reply with annotations", []string{
			`{"input":[{"role":"assistant","content":"x"}]}`,
			`{"input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x","annotations":[{"type":"url_citation","url":"u"}],"logprobs":[]}]}]}`,
		}},
		{&responsesProtocol, "instructions are a leading system message", []string{
			`{"instructions":"be brief","input":[{"role":"user","content":"hi"}]}`,
			`{"input":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
		}},
		{&responsesProtocol, "a function tool, flat or in chat's shape, in any order", []string{
			`{"tools":[{"type":"function","name":"f","description":"d","parameters":{"a":1,"b":[2]},"strict":true},{"type":"function","name":"g"}],"input":[]}`,
			`{"tools":[{"type":"function","name":"g"},{"type":"function","function":{"name":"f","description":"d","parameters":{"b":[2],"a":1.0}}}],"input":[]}`,
			`{"tools":[{"name":"g","type":"function"},{"parameters":{"b":[2],"a":1},"description":"d","name":"f"}],"input":[]}`,
		}},
		{&responsesProtocol, "arguments given as an object", []string{
			`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":{"b":1,"a":2}}]}`,
			`{"input":[{"arguments":{"a":2,"b":1},"name":"f","call_id":"c","type":"function_call","status":"completed","id":"fc_2"}]}`,
		}},
		{&messagesProtocol, "a user message", []string{
			`{"messages":[{"role":"user","content":"hi"}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"hi","citations":null}]}]}`,
		}},
		{&messagesProtocol, "a system string or blocks", []string{
			`{"system":"be brief","messages":[]}`,
			`{"system":[{"type":"text","text":"be brief"}],"messages":[]}`,
			`{"system":[{"type":"text","text":"be brief"},{"type":"text","text":""}],"messages":[]}`,
		}},
		{&messagesProtocol, "tools in any order, schemas in any order", []string{
			`{"tools":[{"name":"a","input_schema":{"x":1,"y":2}},{"name":"b","description":"d"}],"messages":[]}`,
			`{"tools":[{"name":"b","description":"d","type":"custom"},{"input_schema":{"y":2,"x":1},"name":"a"}],"messages":[]}`,
		}},
		{&messagesProtocol, "a thinking block's signature and a tool input's order", []string{
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s1"},{"type":"tool_use","id":"i","name":"f","input":{"a":1,"b":2}}]}]}`,
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s2"},{"type":"tool_use","id":"i","name":"f","input":{"b":2,"a":1}}]}]}`,
		}},
	}
	for _, g := range groups {
		t.Run(g.p.name+"/"+g.name, func(t *testing.T) {
			want := keyAs(t, g.p, g.bodies[0])
			if want == "" {
				t.Fatal("empty key")
			}
			for _, b := range g.bodies[1:] {
				if got := keyAs(t, g.p, b); got != want {
					t.Errorf("%s\nkey %q, want %q", b, got, want)
				}
			}
		})
	}
}

// Messages and function tools are written as chat writes them, so a conversation keeps its key
// from one protocol to the other.
func TestAgentKeyOfMessagesIsChats(t *testing.T) {
	chat := keyOf(t, []byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}],`+
		`"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"a":1}}}]}`))
	responses := keyAs(t, &responsesProtocol, `{"instructions":"s","input":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"output_text","text":"hello"}]}],`+
		`"tools":[{"type":"function","name":"f","description":"d","parameters":{"a":1}}]}`)
	messages := keyAs(t, &messagesProtocol, `{"system":"s","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"hello"}]}],`+
		`"tools":[{"name":"f","description":"d","input_schema":{"a":1}}]}`)
	if chat != responses || chat != messages {
		t.Errorf("chat %q\nresponses %q\nmessages %q", chat, responses, messages)
	}
}

// cache_control never affects the key: not on the system, a tool (by name or written whole), a
// message block of any kind, nor a block inside a tool result.
func TestMessagesKeyIgnoresCacheControl(t *testing.T) {
	const cc = `"cache_control":{"type":"ephemeral"},`
	base := `{"system":[{"type":"text",@"text":"s"}],
		"tools":[{"name":"f",@"input_schema":{"a":1}},{"type":"web_search_20250305",@"name":"web_search"}],
		"messages":[{"role":"user","content":[{"type":"text",@"text":"hi"},{"type":"image",@"source":{}}]},
			{"role":"assistant","content":[{"type":"tool_use",@"id":"t","name":"f","input":{"a":1}}]},
			{"role":"user","content":[{"type":"tool_result",@"tool_use_id":"t","content":[{"type":"text",@"text":"r"}]},{"type":"server_x",@"a":1}]}]}`
	n := strings.Count(base, "@")
	want := keyAs(t, &messagesProtocol, strings.ReplaceAll(base, "@", ""))
	for i := range n {
		// The marker on the i-th place only, then with another ttl, then on every place.
		for _, marker := range []string{cc, `"cache_control":{"type":"ephemeral","ttl":"1h"},`} {
			parts := strings.Split(base, "@")
			body := strings.Join(parts[:i+1], "") + marker + strings.Join(parts[i+1:], "")
			if got := keyAs(t, &messagesProtocol, body); got != want {
				t.Errorf("cache_control at place %d changed the key:\n%s\n%q\nwant %q", i, body, got, want)
			}
		}
	}
	if got := keyAs(t, &messagesProtocol, strings.ReplaceAll(base, "@", cc)); got != want {
		t.Errorf("cache_control everywhere changed the key: %q", got)
	}
	// A block's own cache_control is left out, but a tool input's member of that name is the
	// tool's, and stays.
	a := keyAs(t, &messagesProtocol, `{"messages":[{"role":"user","content":[{"type":"tool_use","input":{"cache_control":1}}]}]}`)
	b := keyAs(t, &messagesProtocol, `{"messages":[{"role":"user","content":[{"type":"tool_use","input":{}}]}]}`)
	if a == b {
		t.Error("a tool input's cache_control member was left out")
	}
}

// Claude Code marks the newest message with cache_control every turn, moving the marker from the
// message that had it: each turn's key still extends the last one's.
func TestMessagesKeyPrefixAsTheMarkerMoves(t *testing.T) {
	turns := []string{
		`{"role":"user","content":[{"type":"text","text":"fix the test"@}]}`,
		`{"role":"assistant","content":[{"type":"text","text":"Running it."},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"go test"}@}]}`,
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"FAIL"@}]}`,
		`{"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{"query":"assert"}@}]}`,
		`{"role":"user","content":[{"type":"web_search_tool_result","tool_use_id":"s1","content":[]@}]}`,
		`{"role":"assistant","content":[{"type":"thinking","thinking":"The assert is off.","signature":"x"},{"type":"text","text":"Fixed."@}]}`,
		`{"role":"user","content":"thanks"}`,
	}
	const marker = `,"cache_control":{"type":"ephemeral"}`
	prefix := `{"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],` +
		`"tools":[{"name":"Bash","description":"Run","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],"messages":[`
	prev := ""
	for n := 1; n <= len(turns); n++ {
		msgs := make([]string, n)
		for i := range n {
			m := turns[i]
			if i == n-1 {
				m = strings.Replace(m, "@", marker, 1)
			}
			msgs[i] = strings.Replace(m, "@", "", 1)
		}
		k := keyAs(t, &messagesProtocol, prefix+strings.Join(msgs, ",")+"]}")
		if !strings.HasPrefix(k, prev) || len(k) <= len(prev) {
			t.Fatalf("turn %d: key %q does not extend %q", n, k, prev)
		}
		prev = k
	}
}

// Every field the key reads changes it.
func TestAgentKeyCoversEveryField(t *testing.T) {
	responses := `{"instructions":"be brief","tools":[{"type":"function","name":"run","description":"Run it","parameters":{"a":1}},{"type":"web_search","size":"low"}],
		"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},
			{"role":"assistant","content":[{"type":"output_text","text":"hello"},{"type":"refusal","refusal":"no"}]},
			{"type":"function_call","call_id":"c1","name":"run","arguments":"{\"x\":1}"},
			{"type":"function_call_output","call_id":"c1","output":"ok"},
			{"type":"reasoning","summary":[{"type":"summary_text","text":"why"}],"content":[{"type":"reasoning_text","text":"how"}],"encrypted_content":"enc"},
			{"type":"item_reference","id":"r1"}]}`
	messages := `{"system":"be brief","tools":[{"name":"run","description":"Run it","input_schema":{"a":1}},{"type":"bash_20250124","name":"bash"}],
		"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},
			{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"redacted_thinking","data":"enc"},{"type":"tool_use","id":"t1","name":"run","input":{"x":1}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":false,"content":[{"type":"text","text":"ok"}]},{"type":"search_result","title":"T"}]}]}`
	tests := []struct {
		p        *agentProtocol
		base     string
		field    string
		old, new string
	}{
		{p: &responsesProtocol, base: responses, field: "instructions", old: `"be brief"`, new: `"be brisk"`},
		{p: &responsesProtocol, base: responses, field: "tool name", old: `"name":"run"`, new: `"name":"ran"`},
		{p: &responsesProtocol, base: responses, field: "tool description", old: `"Run it"`, new: `"Ran it"`},
		{p: &responsesProtocol, base: responses, field: "tool parameters", old: `{"a":1}}`, new: `{"a":2}}`},
		{p: &responsesProtocol, base: responses, field: "other tool", old: `"low"`, new: `"high"`},
		{p: &responsesProtocol, base: responses, field: "role", old: `{"role":"user"`, new: `{"role":"developer"`},
		{p: &responsesProtocol, base: responses, field: "text", old: `"hi"`, new: `"ho"`},
		{p: &responsesProtocol, base: responses, field: "part type", old: `"input_text"`, new: `"input_image"`},
		{p: &responsesProtocol, base: responses, field: "output text", old: `"hello"`, new: `"hallo"`},
		{p: &responsesProtocol, base: responses, field: "refusal", old: `"no"`, new: `"na"`},
		{p: &responsesProtocol, base: responses, field: "call_id", old: `"call_id":"c1","name"`, new: `"call_id":"c2","name"`},
		{p: &responsesProtocol, base: responses, field: "call name", old: `"name":"run","arguments"`, new: `"name":"ran","arguments"`},
		{p: &responsesProtocol, base: responses, field: "arguments", old: `{\"x\":1}`, new: `{\"x\":2}`},
		{p: &responsesProtocol, base: responses, field: "output's call_id", old: `"call_id":"c1","output"`, new: `"call_id":"c2","output"`},
		{p: &responsesProtocol, base: responses, field: "output", old: `"ok"`, new: `"ko"`},
		{p: &responsesProtocol, base: responses, field: "summary", old: `"why"`, new: `"who"`},
		{p: &responsesProtocol, base: responses, field: "reasoning content", old: `"how"`, new: `"hoe"`},
		{p: &responsesProtocol, base: responses, field: "encrypted_content", old: `"enc"`, new: `"end"`},
		{p: &responsesProtocol, base: responses, field: "other item", old: `"r1"`, new: `"r2"`},
		{p: &responsesProtocol, base: responses, field: "item type", old: `"type":"function_call_output"`, new: `"type":"function_call_result"`},
		{p: &messagesProtocol, base: messages, field: "system", old: `"be brief"`, new: `"be brisk"`},
		{p: &messagesProtocol, base: messages, field: "tool name", old: `"name":"run","description"`, new: `"name":"ran","description"`},
		{p: &messagesProtocol, base: messages, field: "tool description", old: `"Run it"`, new: `"Ran it"`},
		{p: &messagesProtocol, base: messages, field: "tool input_schema", old: `{"a":1}`, new: `{"a":2}`},
		{p: &messagesProtocol, base: messages, field: "server tool", old: `"bash_20250124"`, new: `"bash_20241022"`},
		{p: &messagesProtocol, base: messages, field: "role", old: `{"role":"user"`, new: `{"role":"assistant"`},
		{p: &messagesProtocol, base: messages, field: "text", old: `"hi"`, new: `"ho"`},
		{p: &messagesProtocol, base: messages, field: "thinking", old: `"hmm"`, new: `"hum"`},
		{p: &messagesProtocol, base: messages, field: "redacted data", old: `"enc"`, new: `"end"`},
		{p: &messagesProtocol, base: messages, field: "tool_use id", old: `"id":"t1"`, new: `"id":"t2"`},
		{p: &messagesProtocol, base: messages, field: "tool_use name", old: `"name":"run","input"`, new: `"name":"ran","input"`},
		{p: &messagesProtocol, base: messages, field: "tool_use input", old: `{"x":1}`, new: `{"x":2}`},
		{p: &messagesProtocol, base: messages, field: "tool_use_id", old: `"tool_use_id":"t1"`, new: `"tool_use_id":"t2"`},
		{p: &messagesProtocol, base: messages, field: "is_error", old: `"is_error":false`, new: `"is_error":true`},
		{p: &messagesProtocol, base: messages, field: "tool result", old: `"ok"`, new: `"ko"`},
		{p: &messagesProtocol, base: messages, field: "other block", old: `"T"`, new: `"U"`},
	}
	for _, tt := range tests {
		t.Run(tt.p.name+"/"+tt.field, func(t *testing.T) {
			if !strings.Contains(tt.base, tt.old) {
				t.Fatalf("%s not in the base body", tt.old)
			}
			want := keyAs(t, tt.p, tt.base)
			if got := keyAs(t, tt.p, strings.Replace(tt.base, tt.old, tt.new, 1)); got == want {
				t.Errorf("changing the %s kept the key %q", tt.field, got)
			}
		})
	}
}

// Moving text from one field, part, item or block to another, or splitting it otherwise, changes
// the key.
func TestAgentKeyNoCollisionByMovingText(t *testing.T) {
	pairs := []struct {
		p          *agentProtocol
		name, a, b string
	}{
		{&responsesProtocol, "content split across parts", `{"input":[{"role":"user","content":"ab"}]}`,
			`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}`},
		{&responsesProtocol, "content split across items", `{"input":[{"role":"user","content":"ab"}]}`,
			`{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`},
		{&responsesProtocol, "text moved to the next item", `{"input":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}`,
			`{"input":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}`},
		{&responsesProtocol, "text vs refusal", `{"input":[{"role":"assistant","content":[{"type":"output_text","text":"no"}]}]}`,
			`{"input":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`},
		{&responsesProtocol, "call_id vs name", `{"input":[{"type":"function_call","call_id":"ab","name":""}]}`,
			`{"input":[{"type":"function_call","call_id":"a","name":"b"}]}`},
		{&responsesProtocol, "name vs arguments", `{"input":[{"type":"function_call","name":"ab","arguments":""}]}`,
			`{"input":[{"type":"function_call","name":"a","arguments":"b"}]}`},
		{&responsesProtocol, "call vs message", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`,
			`{"input":[{"role":"assistant","content":"f2:c11:f2:{}."}]}`},
		{&responsesProtocol, "output vs user message", `{"input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`,
			`{"input":[{"role":"user","content":"x"}]}`},
		{&responsesProtocol, "output's call_id vs its text", `{"input":[{"type":"function_call_output","call_id":"cx","output":""}]}`,
			`{"input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`},
		{&responsesProtocol, "summary vs reasoning text", `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]}]}`,
			`{"input":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"t"}]}]}`},
		{&responsesProtocol, "encrypted vs summary", `{"input":[{"type":"reasoning","encrypted_content":"t"}]}`,
			`{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]}]}`},
		{&responsesProtocol, "instructions vs a tool description", `{"instructions":"d","tools":[{"type":"function","name":"f"}],"input":[]}`,
			`{"tools":[{"type":"function","name":"f","description":"d"}],"input":[]}`},
		{&responsesProtocol, "a tool split in two", `{"tools":[{"name":"a","description":"bc"}],"input":[]}`,
			`{"tools":[{"name":"a","description":"b"},{"name":"c"}],"input":[]}`},
		{&responsesProtocol, "an item forged in text", `{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`,
			`{"input":[{"role":"user","content":"a.uc1:b"}]}`},
		{&responsesProtocol, "an item written whole vs its text", `{"input":[{"type":"x","text":"a"}]}`,
			`{"input":[{"role":"user","content":"J21:{\"text\":\"a\",\"type\":\"x\"}"}]}`},
		{&messagesProtocol, "content split across blocks", `{"messages":[{"role":"user","content":"ab"}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`},
		{&messagesProtocol, "a block moved to the next message",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`},
		{&messagesProtocol, "text after a tool result vs inside it",
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"a"},{"type":"text","text":"b"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}]}`},
		{&messagesProtocol, "tool_use id vs name", `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"ab","name":""}]}]}`,
			`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b"}]}]}`},
		{&messagesProtocol, "thinking vs text", `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"}]}]}`,
			`{"messages":[{"role":"assistant","content":[{"type":"text","text":"t"}]}]}`},
		{&messagesProtocol, "redacted vs thinking", `{"messages":[{"role":"assistant","content":[{"type":"redacted_thinking","data":"t"}]}]}`,
			`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"}]}]}`},
		{&messagesProtocol, "an error result vs another", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":true,"content":"x"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`},
		{&messagesProtocol, "system vs first user message", `{"system":"a","messages":[{"role":"user","content":"b"}]}`,
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`},
		{&messagesProtocol, "a message forged in text", `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`,
			`{"messages":[{"role":"user","content":"a.uc1:b"}]}`},
	}
	for _, p := range pairs {
		t.Run(p.p.name+"/"+p.name, func(t *testing.T) {
			if ka, kb := keyAs(t, p.p, p.a), keyAs(t, p.p, p.b); ka == kb {
				t.Errorf("two conversations share the key %q", ka)
			}
		})
	}
}

// A conversation with no text has an empty key, and so falls back to nothing but its ids.
func TestAgentTextlessConversationIsEmpty(t *testing.T) {
	tests := []struct {
		p    *agentProtocol
		body string
	}{
		{&responsesProtocol, `{"input":""}`},
		{&responsesProtocol, `{"input":[]}`},
		{&responsesProtocol, `{"instructions":"","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"},{"type":"input_file","file_id":"f"},{"type":"input_text","text":""}]}]}`},
		{&responsesProtocol, `{"input":[{"type":"function_call_output","call_id":"c","output":""},{"type":"reasoning","summary":[]}]}`},
		{&messagesProtocol, `{"messages":[]}`},
		{&messagesProtocol, `{"system":"","messages":[{"role":"user","content":[{"type":"image","source":{}},{"type":"document","source":{}},{"type":"text","text":""}]}]}`},
		{&messagesProtocol, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}}]},{"type":"thinking","thinking":""}]}]}`},
	}
	for _, tt := range tests {
		r := mustParseAs(t, tt.p, nil, tt.body)
		if !r.Chat || r.Text != "" || r.HashKey != "" {
			t.Errorf("%s(%s) = %+v, want a conversation with an empty key", tt.p.name, tt.body, r)
		}
	}
}

// A key whose bound is more than twice the body (invalid UTF-8, each byte of which is U+FFFD in
// the key) is counted first, then written into a buffer of its exact size; text keys are written
// in one pass.
func TestAgentKeyPasses(t *testing.T) {
	bad := strings.Repeat("\xff", 4096)
	tests := []struct {
		p       *agentProtocol
		body    string
		onePass bool
	}{
		{&responsesProtocol, `{"instructions":"be brief","input":[{"role":"user","content":"` + strings.Repeat("word ", 1000) + `"}]}`, true},
		{&messagesProtocol, `{"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("word ", 1000) + `"}]}]}`, true},
		{&responsesProtocol, `{"input":[{"role":"user","content":"` + bad + `"}]}`, false},
		{&messagesProtocol, `{"messages":[{"role":"user","content":"` + bad + `"}]}`, false},
	}
	for _, tt := range tests {
		key, onePass := protocol.WritesAgentKeyInOnePass(tt.p.name, []byte(tt.body))
		if onePass != tt.onePass {
			t.Errorf("%s %.40q: written in one pass %v, want %v", tt.p.name, tt.body, onePass, tt.onePass)
		}
		if r := mustParseAs(t, tt.p, nil, tt.body); key == "" || key != r.Text {
			t.Errorf("%s %.40q: key %.40q, the reader's %.40q", tt.p.name, tt.body, key, r.Text)
		}
		checkAgentBothWays(t, tt.p, []byte(tt.body))
	}
}

// A content array is written as it is read when what comes before it in the key is known (see
// streaming); a later member that changes that takes it back, and the object is written again once
// read whole. The key is then as if nothing had been streamed, and the writer never outgrew the
// buffer of the key's bound, though the streamed content was written before the item turned out to
// be of another kind.
func TestAgentKeyOfContentTakenBack(t *testing.T) {
	long := strings.Repeat("x", 1000)
	parts := `[{"type":"input_text","text":"` + long + `"}]`
	blocks := `[{"type":"text","text":"` + long + `"}]`
	tests := []struct {
		p          *agentProtocol
		name       string
		body, same string
	}{
		{&responsesProtocol, "a later type", `{"input":[{"type":"message","role":"user","content":` + parts + `,"type":"function_call"}]}`,
			`{"input":[{"type":"function_call"}]}`},
		{&responsesProtocol, "a later role", `{"input":[{"type":"message","role":"user","content":` + parts + `,"role":"assistant"}]}`,
			`{"input":[{"role":"assistant","content":"` + long + `"}]}`},
		{&responsesProtocol, "a later content", `{"input":[{"type":"message","role":"user","content":` + parts + `,"content":"y"}]}`,
			`{"input":[{"role":"user","content":"y"}]}`},
		{&responsesProtocol, "an output, then a later type", `{"input":[{"type":"function_call_output","call_id":"c","output":` + parts + `,"type":"x"}]}`,
			`{"input":[{"type":"x","call_id":"c","output":` + parts + `}]}`},
		{&responsesProtocol, "an output, then a later call_id", `{"input":[{"type":"function_call_output","call_id":"c","output":` + parts + `,"call_id":"d"}]}`,
			`{"input":[{"type":"function_call_output","call_id":"d","output":"` + long + `"}]}`},
		{&messagesProtocol, "a later role", `{"messages":[{"role":"user","content":` + blocks + `,"role":"assistant"}]}`,
			`{"messages":[{"role":"assistant","content":"` + long + `"}]}`},
		{&messagesProtocol, "a later content", `{"messages":[{"role":"user","content":` + blocks + `,"content":[]}]}`,
			`{"messages":[{"role":"user"}]}`},
		{&messagesProtocol, "a tool result, then a later type", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":` + blocks + `,"type":"x"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"x","tool_use_id":"t","content":` + blocks + `}]}]}`},
		{&messagesProtocol, "a tool result, then a later tool_use_id", `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":` + blocks + `,"tool_use_id":"u","is_error":true}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"u","is_error":true,"content":"` + long + `"}]}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.p.name+"/"+tt.name, func(t *testing.T) {
			if got, want := keyAs(t, tt.p, tt.body), keyAs(t, tt.p, tt.same); got != want {
				t.Errorf("key %.80q\nwant %.80q", got, want)
			}
			checkAgentBothWays(t, tt.p, []byte(tt.body))
		})
	}
}
