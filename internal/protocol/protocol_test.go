package protocol_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

func mustParse(t *testing.T, h http.Header, body string) *protocol.Request {
	t.Helper()
	r, err := protocol.ParseChat(h, []byte(body))
	if err != nil {
		t.Fatalf("Parse(%s): %v", body, err)
	}
	return r
}

func TestParseBasicFields(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		model  string
		stream bool
		chat   bool
	}{
		{"chat", `{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "llama", true, true},
		{"chat without model", `{"messages":[]}`, "", false, true},
		{"completion", `{"model":"m","prompt":"once upon","stream":false}`, "m", false, false},
		{"null stream", `{"model":"m","prompt":"p","stream":null}`, "m", false, false},
		{"null messages is not chat", `{"messages":null,"prompt":"p"}`, "", false, false},
		{"leading whitespace", " \n\t{\"model\":\"m\"}", "m", false, false},
		{"unknown fields ignored", `{"model":"m","temperature":0.2,"extra":{"deep":[1,2,{"x":null}]}}`, "m", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParse(t, nil, tt.body)
			if r.Model != tt.model || r.Stream != tt.stream || r.Chat != tt.chat {
				t.Errorf("model %q stream %v chat %v; want %q %v %v", r.Model, r.Stream, r.Chat, tt.model, tt.stream, tt.chat)
			}
		})
	}
}

// The hash policies' key: the id headers in order, then the top-level body ids, else the routing
// text. Ids nested anywhere else (message roles, tool schemas, system text) are never taken.
func TestHashKey(t *testing.T) {
	const chatHi = `{"messages":[{"role":"user","content":"hi"}]}`
	textOf := func(body string) string { return mustParse(t, nil, body).Text }
	tests := []struct {
		name string
		h    http.Header
		body string
		want string
	}{
		{"body user next to a user role", nil, `{"messages":[{"role":"user","content":"hi"}],"user":"alice"}`, "alice"},
		{"tool schema with a session_id property and no id",
			nil,
			`{"messages":[{"role":"user","content":"book it"}],"tools":[{"type":"function","function":{"name":"book","parameters":{"type":"object","properties":{"session_id":{"type":"string"},"user_id":{"type":"string"}},"required":["session_id"]}}}]}`,
			textOf(`{"messages":[{"role":"user","content":"book it"}],"tools":[{"type":"function","function":{"name":"book","parameters":{"type":"object","properties":{"session_id":{"type":"string"},"user_id":{"type":"string"}},"required":["session_id"]}}}]}`)},
		{"system text mentioning user_id", nil,
			`{"messages":[{"role":"system","content":"user_id: 42\nsession_id: 7"},{"role":"user","content":"hi"}]}`,
			textOf(`{"messages":[{"role":"system","content":"user_id: 42\nsession_id: 7"},{"role":"user","content":"hi"}]}`)},
		{"nested metadata ids are not top level", nil, `{"prompt":"p","metadata":{"user_id":"u","session_id":"s"},"session_params":{"user":"x"}}`, "p"},
		{"message-level fields are not top level", nil, `{"messages":[{"role":"user","content":"hi","user":"bob","session_id":"s"}]}`, textOf(chatHi)},
		{"x-session-id first", testkit.Header("x-session-id", "s", "x-user-id", "u", "x-tenant-id", "t", "x-correlation-id", "c", "x-request-id", "r", "x-trace-id", "tr"), `{"user":"b"}`, "s"},
		{"then x-user-id", testkit.Header("x-user-id", "u", "x-tenant-id", "t", "x-correlation-id", "c", "x-request-id", "r", "x-trace-id", "tr"), `{"user":"b"}`, "u"},
		{"then x-tenant-id", testkit.Header("x-tenant-id", "t", "x-correlation-id", "c", "x-request-id", "r", "x-trace-id", "tr"), `{"user":"b"}`, "t"},
		{"then x-correlation-id", testkit.Header("x-correlation-id", "c", "x-request-id", "r", "x-trace-id", "tr"), `{"user":"b"}`, "c"},
		{"then x-request-id", testkit.Header("x-request-id", "r", "x-trace-id", "tr"), `{"user":"b"}`, "r"},
		{"then x-trace-id", testkit.Header("x-trace-id", "tr"), `{"user":"b"}`, "tr"},
		{"header names are case-insensitive", testkit.Header("X-SESSION-ID", "s"), `{}`, "s"},
		{"blank header skipped", testkit.Header("x-session-id", "  ", "x-user-id", "u"), `{}`, "u"},
		{"body session_params first", nil, `{"session_params":{"session_id":"p"},"user":"u","session_id":"s","user_id":"i"}`, "p"},
		{"then body user", nil, `{"user":"u","session_id":"s","user_id":"i"}`, "u"},
		{"then body session_id", nil, `{"session_id":"s","user_id":"i"}`, "s"},
		{"then body user_id", nil, `{"user_id":"i","prompt":"p"}`, "i"},
		{"blank body ids skipped", nil, `{"session_params":{"session_id":" "},"user":"","session_id":"\t","user_id":"i"}`, "i"},
		{"numeric id", nil, `{"user_id":42,"prompt":"p"}`, "42"},
		{"non-scalar ids are no id", nil, `{"user":{"name":"x"},"session_id":[1],"user_id":true,"prompt":"p"}`, "p"},
		{"ids trimmed", testkit.Header("x-session-id", " s1 "), `{}`, "s1"},
		{"no id, completion", nil, `{"prompt":"the prompt"}`, "the prompt"},
		{"no id, no text", nil, `{"model":"m"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParse(t, tt.h, tt.body)
			if r.HashKey != tt.want {
				t.Errorf("HashKey = %q, want %q", r.HashKey, tt.want)
			}
		})
	}
}

func TestHashKeyFallsBackToRoutingTextNotToNestedIDs(t *testing.T) {
	body := `{"messages":[{"role":"system","content":"user_id: 42"},{"role":"user","content":"hi"}]}`
	r := mustParse(t, nil, body)
	if r.Text == "" || r.HashKey != r.Text {
		t.Errorf("HashKey %q, Text %q: want the routing text", r.HashKey, r.Text)
	}
	if r.SessionKey != "" {
		t.Errorf("SessionKey = %q, want none", r.SessionKey)
	}
	if r.HashKey == "42" || r.HashKey == "user" {
		t.Errorf("HashKey %q taken from message text", r.HashKey)
	}
}

func TestSessionKeyPrecedence(t *testing.T) {
	checkKeyPrecedence(t, `"messages":[{"role":"user","content":"hi"}]`, slices.Concat(
		[]keySource{{body: `"session_params":{"session_id":"sp"}`, value: "session:sp"}},
		sessionHeaderSources,
		[]keySource{
			{body: `"session_id":"bs"`, value: "session:bs"},
			{header: "x-user-id", value: "user:xu"},
			{body: `"user_id":"bu"`, value: "user:bu"},
			{body: `"user":"bw"`, value: "user:bw"},
		},
	), func(h http.Header, body string) *protocol.Request { return mustParse(t, h, body) })
}

// keySource is one place a session key comes from: a header or a body member (exactly one is
// set), and the key it gives.
type keySource struct {
	header, body, value string
}

// sessionHeaderSources are the session headers every protocol reads (the same list for chat,
// Responses and Messages), highest precedence first, each with a value of its own.
var sessionHeaderSources = []keySource{
	{header: "x-session-id", value: "session:xs"},
	{header: "x-claude-code-session-id", value: "session:cc"},
	{header: "x-session-affinity", value: "session:aff"},
	{header: "session-id", value: "session:dash"},
	{header: "session_id", value: "session:under"},
}

// checkKeyPrecedence fails unless, for each of sources (from the highest precedence down), a body
// of base with that source and every one below it present is keyed by that source.
func checkKeyPrecedence(t *testing.T, base string, sources []keySource, parse func(h http.Header, body string) *protocol.Request) {
	t.Helper()
	for i := range sources {
		h := http.Header{}
		fields := []string{base}
		for _, s := range sources[i:] {
			if s.header != "" {
				h.Set(s.header, strings.SplitN(s.value, ":", 2)[1])
			} else {
				fields = append(fields, s.body)
			}
		}
		body := "{" + strings.Join(fields, ",") + "}"
		if r := parse(h, body); r.SessionKey != sources[i].value {
			t.Errorf("with sources %d.. present: SessionKey = %q, want %q (headers %v, body %s)", i, r.SessionKey, sources[i].value, h, body)
		}
	}
}

func TestSessionKey(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		body string
		want string
	}{
		{"no id", nil, `{"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"user role is not a user id", nil, `{"messages":[{"role":"user","content":"hi","name":"bob"}]}`, ""},
		{"tool schema session_id property is not an id", nil, `{"messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"session_id":{"type":"string","default":"zzz"}}}}}]}`, ""},
		{"system text is not an id", nil, `{"messages":[{"role":"system","content":"user_id: 42"}]}`, ""},
		{"blank session header falls through", testkit.Header("x-session-id", "   ", "x-user-id", "u"), `{}`, "user:u"},
		{"blank body session falls through", nil, `{"session_params":{"session_id":""},"session_id":" ","user":"u"}`, "user:u"},
		{"session_params not an object", nil, `{"session_params":"s","user":"u"}`, "user:u"},
		{"numeric session id", nil, `{"session_id":12345}`, "session:12345"},
		{"numeric user id", nil, `{"user_id":42}`, "user:42"},
		{"negative numeric id", nil, `{"session_params":{"session_id":-7}}`, "session:-7"},
		{"boolean id is no id", nil, `{"session_id":true,"user":"u"}`, "user:u"},
		{"null id is no id", nil, `{"session_id":null,"user":"u"}`, "user:u"},
		{"id trimmed", nil, `{"session_id":"  abc  "}`, "session:abc"},
		{"escaped id decoded", nil, `{"session_id":"a\u0062c"}`, "session:abc"},
		{"header name case", testkit.Header("X-Claude-Code-Session-Id", "cc"), `{}`, "session:cc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := mustParse(t, tt.h, tt.body); r.SessionKey != tt.want {
				t.Errorf("SessionKey = %q, want %q", r.SessionKey, tt.want)
			}
		})
	}
}

func TestSessionKeySameIDFromHeaderOrBody(t *testing.T) {
	const chat = `"messages":[{"role":"user","content":"hi"}]`
	groups := []struct {
		name  string
		forms []struct {
			h    http.Header
			body string
		}
	}{
		{"session id", []struct {
			h    http.Header
			body string
		}{
			{testkit.Header("x-session-id", "abc-123"), `{` + chat + `}`},
			{testkit.Header("x-claude-code-session-id", "abc-123"), `{` + chat + `}`},
			{testkit.Header("x-session-affinity", "abc-123"), `{` + chat + `}`},
			{testkit.Header("session-id", "abc-123"), `{` + chat + `}`},
			{testkit.Header("session_id", "abc-123"), `{` + chat + `}`},
			{nil, `{"session_id":"abc-123",` + chat + `}`},
			{nil, `{"session_params":{"session_id":"abc-123"},` + chat + `}`},
		}},
		{"user id", []struct {
			h    http.Header
			body string
		}{
			{testkit.Header("x-user-id", "alice"), `{` + chat + `}`},
			{nil, `{"user_id":"alice",` + chat + `}`},
			{nil, `{"user":"alice",` + chat + `}`},
		}},
		{"numeric user id", []struct {
			h    http.Header
			body string
		}{
			{testkit.Header("x-user-id", "42"), `{` + chat + `}`},
			{nil, `{"user_id":42,` + chat + `}`},
			{nil, `{"user_id":"42",` + chat + `}`},
		}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			first := mustParse(t, g.forms[0].h, g.forms[0].body).SessionKey
			if first == "" {
				t.Fatal("no session key")
			}
			for _, f := range g.forms[1:] {
				if got := mustParse(t, f.h, f.body).SessionKey; got != first {
					t.Errorf("headers %v body %s: SessionKey %q, want %q", f.h, f.body, got, first)
				}
			}
		})
	}
}

func TestSessionAndUserNamespacesDiffer(t *testing.T) {
	s := mustParse(t, testkit.Header("x-session-id", "same"), `{}`).SessionKey
	u := mustParse(t, testkit.Header("x-user-id", "same"), `{}`).SessionKey
	if s != "session:same" || u != "user:same" {
		t.Errorf("session %q user %q", s, u)
	}
}

func TestPerRequestIDsAreNeverSessionKeys(t *testing.T) {
	perRequest := []string{"x-request-id", "x-correlation-id", "x-trace-id", "request-id", "traceparent"}
	for _, name := range perRequest {
		t.Run(name, func(t *testing.T) {
			r := mustParse(t, testkit.Header(name, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), `{"messages":[{"role":"user","content":"hi"}]}`)
			if r.SessionKey != "" {
				t.Errorf("SessionKey = %q from %s", r.SessionKey, name)
			}
			// Nor do they displace a real id of lower precedence.
			r = mustParse(t, testkit.Header(name, "req-1"), `{"user":"alice","messages":[]}`)
			if r.SessionKey != "user:alice" {
				t.Errorf("SessionKey = %q with %s present, want user:alice", r.SessionKey, name)
			}
		})
	}
	// A request id that changes every request leaves the history key alone too.
	a := mustParse(t, testkit.Header("x-request-id", "r1"), `{"messages":[{"role":"user","content":"hi"}]}`)
	b := mustParse(t, testkit.Header("x-request-id", "r2"), `{"messages":[{"role":"user","content":"hi"}]}`)
	if a.Text != b.Text || a.SessionKey != b.SessionKey {
		t.Errorf("a changing x-request-id changed the keys: %+v vs %+v", a, b)
	}
}

func TestLongSessionIDsAreHashedToAFixedSize(t *testing.T) {
	exact := strings.Repeat("a", reqkey.MaxIDLen)
	long1 := strings.Repeat("b", reqkey.MaxIDLen+1)
	long2 := strings.Repeat("b", reqkey.MaxIDLen) + "c"
	huge := strings.Repeat("x", 1<<16)

	if got := mustParse(t, testkit.Header("x-session-id", exact), `{}`).SessionKey; got != "session:"+exact {
		t.Errorf("a %d-byte id was not kept verbatim: %q", reqkey.MaxIDLen, got)
	}
	k1 := mustParse(t, testkit.Header("x-session-id", long1), `{}`).SessionKey
	k2 := mustParse(t, testkit.Header("x-session-id", long2), `{}`).SessionKey
	k3 := mustParse(t, nil, `{"session_id":"`+huge+`"}`).SessionKey
	for _, k := range []string{k1, k2, k3} {
		if !strings.HasPrefix(k, "session:") {
			t.Errorf("hashed key %q lost its namespace", k)
		}
		if strings.Contains(k, "bbbb") || strings.Contains(k, "xxxx") {
			t.Errorf("long id kept verbatim: %.40q...", k)
		}
	}
	if len(k1) != len(k2) || len(k1) != len(k3) || len(k1) > len("session:")+reqkey.MaxIDLen {
		t.Errorf("hashed keys not of one fixed size: %d %d %d", len(k1), len(k2), len(k3))
	}
	if k1 == k2 {
		t.Error("two different long ids hashed to the same key")
	}
	if got := mustParse(t, nil, `{"session_id":"`+long1+`"}`).SessionKey; got != k1 {
		t.Errorf("the same long id from the body gave %q, from the header %q", got, k1)
	}
	u := mustParse(t, testkit.Header("x-user-id", long1), `{}`).SessionKey
	if !strings.HasPrefix(u, "user:") || len(u) != len(k1)-len("session:")+len("user:") {
		t.Errorf("long user id key %q", u)
	}
}

func TestRoutingText(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"completion prompt string", `{"model":"m","prompt":"Once upon a time"}`, "Once upon a time"},
		{"completion prompt list of strings", `{"prompt":["first","second"]}`, "first\nsecond"},
		{"completion prompt token ids", `{"prompt":[101,2023,2003,102]}`, "101 2023 2003 102"},
		{"completion prompt batch of token ids", `{"prompt":[[1,2],[3]]}`, "1 2\n3"},
		{"large token id stays digits", `{"prompt":[151643,0]}`, "151643 0"},
		{"generate text", `{"text":"hello there","sampling_params":{"max_new_tokens":8}}`, "hello there"},
		{"generate input_ids", `{"input_ids":[7,8,9]}`, "7 8 9"},
		{"generate text list", `{"text":["a","b"]}`, "a\nb"},
		{"empty prompt", `{"prompt":""}`, ""},
		{"empty prompt falls through to text", `{"prompt":"","text":"t"}`, "t"},
		{"no prompt", `{"model":"m","input":"embedding input"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParse(t, nil, tt.body)
			if r.Chat {
				t.Error("non-chat request marked as chat")
			}
			if r.Text != tt.want {
				t.Errorf("Text = %q, want %q", r.Text, tt.want)
			}
		})
	}
}

func TestRoutingTextTokenIDsAreNotCollapsed(t *testing.T) {
	prompts := []string{
		`[1,2,3]`, `[1,2,4]`, `[12,3]`, `[1,23]`, `[123]`, `[3,2,1]`, `[1,2,3,0]`,
		`[[1,2],[3]]`, `[[1],[2,3]]`, `[0]`, `[]`,
	}
	seen := map[string]string{}
	for _, p := range prompts {
		for _, field := range []string{"prompt", "input_ids"} {
			r := mustParse(t, nil, `{"`+field+`":`+p+`}`)
			if p != `[]` && r.Text == "" {
				t.Errorf("%s %s: empty routing text", field, p)
			}
			if field == "prompt" {
				if prev, dup := seen[r.Text]; dup {
					t.Errorf("token prompts %s and %s give the same routing text %q", prev, p, r.Text)
				}
				seen[r.Text] = p
			}
		}
	}
	// Same length, different ids: texts differ (not a count of tokens).
	a := mustParse(t, nil, `{"prompt":[5,6,7,8]}`).Text
	b := mustParse(t, nil, `{"prompt":[9,9,9,9]}`).Text
	if a == b {
		t.Errorf("different id lists of one length give the same text %q", a)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"empty body", ``},
		{"whitespace only", " \n\t "},
		{"malformed JSON", `{"model":"m",`},
		{"unterminated string", `{"model":"m}`},
		{"trailing garbage", `{"model":"m"} x`},
		{"two objects", `{}{}`},
		{"array", `[{"model":"m"}]`},
		{"string", `"hello"`},
		{"number", `42`},
		{"null", `null`},
		{"true", `true`},
		{"model not a string", `{"model":5}`},
		{"stream not a bool", `{"stream":"yes"}`},
		{"messages not an array", `{"messages":"hi"}`},
		{"messages an object", `{"messages":{"role":"user"}}`},
		{"message not an object", `{"messages":["hi"]}`},
		{"role not a string", `{"messages":[{"role":1,"content":"hi"}]}`},
		{"name not a string", `{"messages":[{"role":"user","name":[],"content":"hi"}]}`},
		{"tool_calls not an array", `{"messages":[{"role":"assistant","tool_calls":{}}]}`},
		{"tool_call_id not a string", `{"messages":[{"role":"tool","tool_call_id":3,"content":"x"}]}`},
		{"tools not an array", `{"messages":[],"tools":{"name":"f"}}`},
		{"tool function name not a string", `{"messages":[],"tools":[{"function":{"name":1}}]}`},
		{"invalid UTF-16 escape", `{"model":"\uZZZZ"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := protocol.ParseChat(nil, []byte(tt.body))
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tt.body, r)
			}
			var re *protocol.Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *protocol.Error", err, err)
			}
			if r != nil {
				t.Errorf("Parse returned a request beside the error")
			}
			if re.Msg == "" || re.Error() != re.Msg {
				t.Errorf("error message %q", re.Error())
			}
		})
	}
}

func TestParseErrorNamesTheField(t *testing.T) {
	_, err := protocol.ParseChat(nil, []byte(`{"model":"m","messages":"hi"}`))
	if err == nil || !strings.Contains(err.Error(), "messages") {
		t.Errorf("err = %v, want it to name the messages field", err)
	}
}

func TestParseNilHeader(t *testing.T) {
	r := mustParse(t, nil, `{"user":"u","messages":[{"role":"user","content":"x"}]}`)
	if r.SessionKey != "user:u" {
		t.Errorf("SessionKey = %q", r.SessionKey)
	}
}
