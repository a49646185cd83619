package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// unknownKey can never name a field Parse reads: no routing field has a hyphen, in any spelling.
const unknownKey = "x-unknown-field"

func parseSeeds(f *testing.F) {
	for _, s := range []struct {
		body, session string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"user":"alice"}`, ""},
		{`{"messages":[{"role":"system","content":"user_id: 42"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"u"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"session_id":{"type":"string"}}}}}]}`, ""},
		{`{"session_params":{"session_id":7},"prompt":[1,2,3],"stream":true}`, "s-1"},
		{`{"text":["a","b"],"input_ids":[[1],[2,3]]}`, ""},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"b":1,"a":[]}}}]}]}`, " "},
		{`{"user_id":-1.5e3,"session_id":null}`, ""},
		{`[]`, ""},
		{`{"model":`, ""},
		{``, ""},
	} {
		f.Add([]byte(s.body), s.session)
	}
}

// FuzzParse: Parse never panics; its errors are *protocol.Error; a valid JSON object nested under an
// unknown field never fails; adding an unknown field to a body that parses changes nothing; and
// the history key is the same written in one pass or in two.
func FuzzParse(f *testing.F) {
	parseSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, session string) {
		h := sessionHeader(session)
		r, err := protocol.ParseChat(h, body)
		checkBothWays(t, body)
		checkReaderContract(t, protocol.ParseChat, h, body, r, err, `{"user":"zz","messages":7}`)
	})
}

// sessionHeader is a header with session as its x-session-id, or none when session is empty.
func sessionHeader(session string) http.Header {
	h := http.Header{}
	if session != "" {
		h.Set("x-session-id", session)
	}
	return h
}

// checkReaderContract fails unless parse, whose answer to body with h was r and err, keeps the
// contract of every protocol's reader: an error is a *protocol.Error and comes alone; a valid JSON
// object nested under an unknown field never fails; and adding an unknown field holding extra (a
// JSON value) to a body that parses changes nothing.
func checkReaderContract(t *testing.T, parse func(reqkey.Header, []byte) (*protocol.Request, error), h http.Header, body []byte, r *protocol.Request, err error, extra string) {
	t.Helper()
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
	trimmed := bytes.TrimSpace(body)
	if !json.Valid(trimmed) || len(trimmed) == 0 || trimmed[0] != '{' {
		return
	}
	wrapped := append([]byte(`{"`+unknownKey+`":`), trimmed...)
	wrapped = append(wrapped, '}')
	if _, err := parse(h, wrapped); err != nil {
		t.Fatalf("a valid object under an unknown field failed: %v\n%s", err, wrapped)
	}
	if err != nil {
		return
	}
	field := []byte(`{"` + unknownKey + `":` + extra + `,`)
	if bytes.Equal(bytes.TrimLeft(trimmed[1:], " \t\r\n"), []byte("}")) {
		field = field[:len(field)-1]
	}
	withExtra := append(field, trimmed[1:]...)
	r2, err := parse(h, withExtra)
	if err != nil {
		t.Fatalf("adding an unknown field made the reader fail: %v\n%s", err, withExtra)
	}
	if protocol.Routing(r2) != protocol.Routing(r) {
		t.Fatalf("adding an unknown field changed the result:\n%+v\n%+v", r, r2)
	}
}

func prefixSeeds(f *testing.F) {
	for _, s := range []struct{ body, extra string }{
		{`{"messages":[{"role":"user","content":"hi"}]}`, `[{"role":"assistant","content":"hello"}]`},
		{`{"messages":[],"tools":[{"type":"function","function":{"name":"b","parameters":{"z":1,"a":2}}},{"type":"function","function":{"name":"a"}}]}`, `[{"role":"user","content":["x",{"type":"text","text":"y"}]}]`},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, `[{"role":"user","content":"now text"}]`},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`, `[{"role":"tool","tool_call_id":"1","name":"f","content":"r"},{"role":"user","content":""}]`},
		{`{"messages":[{"role":"user","content":"a.m4:user0:0:c1:b"}]}`, `[{"role":"user","content":null}]`},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff.uc\u00ffb\"}]}", "[{\"role\":\"user\",\"name\":\"\xff\",\"content\":\"\ufffd\"}]"},
	} {
		f.Add([]byte(s.body), []byte(s.extra))
	}
}

// FuzzHistoryKeyPrefix: for a chat body H and messages appended to it (H'), key(H) is a byte
// prefix of key(H'). Both bodies are rebuilt from the same decoded values so that they differ
// only by the appended messages.
func FuzzHistoryKeyPrefix(f *testing.F) {
	prefixSeeds(f)
	f.Fuzz(func(t *testing.T, body, extra []byte) {
		var obj map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if dec.Decode(&obj) != nil || obj == nil {
			return
		}
		msgs, ok := obj["messages"].([]any)
		if !ok {
			return
		}
		var more []any
		dec = json.NewDecoder(bytes.NewReader(extra))
		dec.UseNumber()
		if dec.Decode(&more) != nil {
			return
		}
		h, err := json.Marshal(obj)
		if err != nil {
			return
		}
		obj["messages"] = append(msgs[:len(msgs):len(msgs)], more...)
		h2, err := json.Marshal(obj)
		if err != nil {
			return
		}
		r1, err1 := protocol.ParseChat(nil, h)
		r2, err2 := protocol.ParseChat(nil, h2)
		if err1 != nil || err2 != nil {
			return // a field of the wrong type: nothing to compare
		}
		if !strings.HasPrefix(r2.Text, r1.Text) {
			t.Fatalf("key(H) is not a prefix of key(H')\nH  %s\nH' %s\n%q\n%q", h, h2, r1.Text, r2.Text)
		}
	})
}
