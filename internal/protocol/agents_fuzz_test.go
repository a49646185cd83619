package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
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
	h := http.Header{}
	if session != "" {
		h.Set("x-session-id", session)
	}
	r, err := sameAsReference(t, p, h, body)
	if err != nil {
		var re *protocol.Error
		if !errors.As(err, &re) {
			t.Fatalf("error %T %v is not a *protocol.Error", err, err)
		}
		if r != nil {
			t.Fatal("request returned beside an error")
		}
	} else if r == nil {
		t.Fatal("nil request without an error")
	}
	checkAgentBothWays(t, p, body)

	trimmed := bytes.TrimSpace(body)
	if !json.Valid(trimmed) || len(trimmed) == 0 || trimmed[0] != '{' {
		return
	}
	wrapped := append([]byte(`{"`+unknownKey+`":`), trimmed...)
	wrapped = append(wrapped, '}')
	if _, err := p.parse(h, wrapped); err != nil {
		t.Fatalf("a valid object under an unknown field failed: %v\n%s", err, wrapped)
	}
	if err != nil {
		return
	}
	extra := []byte(`{"` + unknownKey + `":{"input":7,"messages":7,"user":"zz"},`)
	if bytes.Equal(bytes.TrimLeft(trimmed[1:], " \t\r\n"), []byte("}")) {
		extra = extra[:len(extra)-1]
	}
	withExtra := append(extra, trimmed[1:]...)
	r2, err := p.parse(h, withExtra)
	if err != nil {
		t.Fatalf("adding an unknown field made the reader fail: %v\n%s", err, withExtra)
	}
	if protocol.Routing(r2) != protocol.Routing(r) {
		t.Fatalf("adding an unknown field changed the result:\n%+v\n%+v", r, r2)
	}
}
