package protocol_test

import (
	"testing"
)

// FuzzParseResponses: ParseResponses never panics; its errors are *protocol.Error; it agrees with
// its encoding/json reference on every body; its history key is the same written in one pass or
// two, within the bounds the lexer found; a valid JSON object under an unknown field never fails,
// and adding an unknown field to a body that parses changes nothing.
func FuzzParseResponses(f *testing.F) {
	for _, s := range []struct{ body, session string }{
		{`{"model":"gpt","input":"hi","store":false,"previous_response_id":"resp_1"}`, ""},
		{`{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"u"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"b":1,"a":2}},{"type":"web_search"}]}`, "s"},
		{`{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}],"encrypted_content":"e"},{"type":"item_reference","id":"r","cache_control":{}}],"conversation":{"id":"c"}}`, ""},
		{`{"input":[{"role":5}]}`, ""},
		{`{"input":[{"content":[1e400]}]}`, ""},
		{`{"input":[],"input":null,"instructions":"x"}`, ""},
	} {
		f.Add([]byte(s.body), s.session)
	}
	f.Fuzz(func(t *testing.T, body []byte, session string) {
		fuzzAgent(t, &responsesProtocol, body, session)
	})
}

// FuzzParseMessages is FuzzParseResponses for ParseMessages.
func FuzzParseMessages(f *testing.F) {
	for _, s := range []struct{ body, session string }{
		{`{"model":"claude","system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u"}}`, ""},
		{`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"x"},{"type":"tool_use","id":"t1","name":"f","input":{"b":1,"a":2}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}],"is_error":true}]}],"tools":[{"name":"f","input_schema":{}},{"type":"web_search_20250305","name":"web_search"}]}`, "s"},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{}},{"type":"server_tool_use","id":"x","cache_control":{}}]}]}`, ""},
		{`{"messages":"hi"}`, ""},
		{`{"messages":[{"content":[{"type":"tool_result","content":[{"type":"tool_result","content":[1e400]}]}]}]}`, ""},
	} {
		f.Add([]byte(s.body), s.session)
	}
	f.Fuzz(func(t *testing.T, body []byte, session string) {
		fuzzAgent(t, &messagesProtocol, body, session)
	})
}

func fuzzAgent(t *testing.T, p *agentProtocol, body []byte, session string) {
	h := sessionHeader(session)
	r, err := sameAsReference(t, p, h, body)
	checkAgentBothWays(t, p, body)
	checkReaderContract(t, p.parse, h, body, r, err, `{"input":7,"messages":7,"user":"zz"}`)
}
