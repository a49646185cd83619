package protocol_test

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// mustParseAs parses body with the reader of p, failing the test on an error or when the
// encoding/json reference reads it otherwise.
func mustParseAs(t testing.TB, p *agentProtocol, h http.Header, body string) *protocol.Request {
	t.Helper()
	r, err := sameAsReference(t, p, h, []byte(body))
	if err != nil {
		t.Fatalf("%s(%s): %v", p.name, body, err)
	}
	return r
}

// fieldsCase is a body and the fields, all but the keys, a protocol's reader takes from it.
type fieldsCase struct {
	name string
	body string
	want protocol.Request // all but the keys
}

// checkFields parses each case's body with the reader of p and fails where the fields read differ
// from the case's, or where a body without a conversation still has a key.
func checkFields(t *testing.T, p *agentProtocol, tests []fieldsCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParseAs(t, p, nil, tt.body)
			got := protocol.Request{Model: r.Model, Stream: r.Stream, Chat: r.Chat, PreviousResponseID: r.PreviousResponseID, NoStore: r.NoStore}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
			if !r.Chat && (r.Text != "" || r.HashKey != "") {
				t.Errorf("a body without a conversation has a key: %+v", r)
			}
		})
	}
}

func TestParseResponsesFields(t *testing.T) {
	checkFields(t, &responsesProtocol, []fieldsCase{
		{"every field", `{"model":"gpt-5","stream":true,"store":false,"previous_response_id":"resp_1","input":"hi"}`,
			protocol.Request{Model: "gpt-5", Stream: true, Chat: true, PreviousResponseID: "resp_1", NoStore: true}},
		{"store true is stored", `{"store":true,"input":"hi"}`, protocol.Request{Chat: true}},
		{"store null is stored", `{"store":null,"input":"hi"}`, protocol.Request{Chat: true}},
		{"no store is stored", `{"input":"hi"}`, protocol.Request{Chat: true}},
		{"previous_response_id null", `{"previous_response_id":null,"input":"hi"}`, protocol.Request{Chat: true}},
		{"previous_response_id escaped", `{"previous_response_\u0069d":"resp_\u0031"}`, protocol.Request{PreviousResponseID: "resp_1"}},
		{"previous_response_id verbatim", `{"previous_response_id":" resp 1 "}`, protocol.Request{PreviousResponseID: " resp 1 "}},
		{"model null", `{"model":null,"input":"hi"}`, protocol.Request{Chat: true}},
		{"stream null", `{"stream":null,"input":"hi"}`, protocol.Request{Chat: true}},
		{"input array", `{"input":[{"role":"user","content":"hi"}]}`, protocol.Request{Chat: true}},
		{"input empty array", `{"input":[]}`, protocol.Request{Chat: true}},
		{"no input is no conversation", `{"model":"m","instructions":"x","tools":[{"type":"web_search"}]}`, protocol.Request{Model: "m"}},
		{"input null is no conversation", `{"input":null}`, protocol.Request{}},
		{"unknown fields ignored", `{"model":"m","temperature":0.2,"reasoning":{"effort":"high"},"text":{"format":{"type":"text"}},"include":["reasoning.encrypted_content"],"x":[1e400]}`,
			protocol.Request{Model: "m"}},
		{"leading whitespace", " \n\t{\"model\":\"m\"}", protocol.Request{Model: "m"}},
	})
	// A continuation of a stored response still has its key: the policy decides what to do.
	r := mustParseAs(t, &responsesProtocol, nil, `{"previous_response_id":"resp_1","input":[{"role":"user","content":"and then?"}]}`)
	if r.Text != spelled("ucand then?·.") {
		t.Errorf("key %q beside previous_response_id", r.Text)
	}
}

func TestParseMessagesFields(t *testing.T) {
	checkFields(t, &messagesProtocol, []fieldsCase{
		{"every field", `{"model":"claude","stream":true,"max_tokens":1024,"messages":[{"role":"user","content":"hi"}]}`,
			protocol.Request{Model: "claude", Stream: true, Chat: true}},
		{"messages empty", `{"messages":[]}`, protocol.Request{Chat: true}},
		{"no messages is no conversation", `{"model":"m","system":"s","tools":[{"name":"f"}]}`, protocol.Request{Model: "m"}},
		{"messages null is no conversation", `{"messages":null}`, protocol.Request{}},
		{"model and stream null", `{"model":null,"stream":null,"messages":[]}`, protocol.Request{Chat: true}},
		{"unknown fields ignored", `{"model":"m","thinking":{"type":"enabled","budget_tokens":1e400},"tool_choice":{"type":"auto"},"stop_sequences":["x"]}`,
			protocol.Request{Model: "m"}},
		{"no Responses fields", `{"store":false,"previous_response_id":"r","input":"x"}`, protocol.Request{}},
	})
}

// Fields of the wrong type are errors that name the field and the type, in Parse's words; the
// first in the body is reported, even in a value a later one replaces, unless the body is
// malformed.
func TestParseAgentTypeErrors(t *testing.T) {
	tests := []struct {
		p          *agentProtocol
		body, want string
	}{
		{&responsesProtocol, `{"model":5,"input":"x"}`, `field "model" must not be a JSON number`},
		{&responsesProtocol, `{"stream":"yes"}`, `field "stream" must not be a JSON string`},
		{&responsesProtocol, `{"store":"no"}`, `field "store" must not be a JSON string`},
		{&responsesProtocol, `{"previous_response_id":7}`, `field "previous_response_id" must not be a JSON number`},
		{&responsesProtocol, `{"instructions":["a"]}`, `field "instructions" must not be a JSON array`},
		{&responsesProtocol, `{"input":5}`, `field "input" must not be a JSON number`},
		{&responsesProtocol, `{"input":{"role":"user"}}`, `field "input" must not be a JSON object`},
		{&responsesProtocol, `{"input":["hi"]}`, `field "input" must not be a JSON string`},
		{&responsesProtocol, `{"input":[{"role":1}]}`, `field "input.role" must not be a JSON number`},
		{&responsesProtocol, `{"input":[{"type":true}]}`, `field "input.type" must not be a JSON bool`},
		{&responsesProtocol, `{"input":[{"type":"function_call","call_id":{}}]}`, `field "input.call_id" must not be a JSON object`},
		{&responsesProtocol, `{"input":[{"type":"function_call","name":[]}]}`, `field "input.name" must not be a JSON array`},
		{&responsesProtocol, `{"input":[{"content":[{"type":"input_text","text":1e400}]}]}`, `field "input.content" must not be a JSON number 1e400`},
		{&responsesProtocol, `{"input":[{"type":"x","n":-1e999}]}`, `field "input" must not be a JSON number -1e999`},
		{&responsesProtocol, `{"tools":{}}`, `field "tools" must not be a JSON object`},
		{&responsesProtocol, `{"tools":["f"]}`, `field "tools" must not be a JSON string`},
		{&responsesProtocol, `{"tools":[{"name":1}]}`, `field "tools.name" must not be a JSON number`},
		{&responsesProtocol, `{"tools":[{"type":"function","description":true}]}`, `field "tools.description" must not be a JSON bool`},
		{&responsesProtocol, `{"tools":[{"type":5}]}`, `field "tools.type" must not be a JSON number`},
		{&responsesProtocol, `{"tools":[{"type":"function","function":"f"}]}`, `field "tools.function" must not be a JSON string`},
		{&responsesProtocol, `{"tools":[{"type":"function","function":{"name":2}}]}`, `field "tools.function.name" must not be a JSON number`},
		{&responsesProtocol, `{"tools":[{"parameters":{"max":1e400}}]}`, `field "tools.parameters" must not be a JSON number 1e400`},
		{&responsesProtocol, `{"input":[{"role":1}],"model":5}`, `field "input.role" must not be a JSON number`},
		{&responsesProtocol, `{"input":5,"input":"x"}`, `field "input" must not be a JSON number`},
		{&messagesProtocol, `{"model":[],"messages":[]}`, `field "model" must not be a JSON array`},
		{&messagesProtocol, `{"stream":1}`, `field "stream" must not be a JSON number`},
		{&messagesProtocol, `{"system":{"type":"text"}}`, `field "system" must not be a JSON object`},
		{&messagesProtocol, `{"system":[{"type":"text","text":"a","n":1e400}]}`, `field "system" must not be a JSON number 1e400`},
		{&messagesProtocol, `{"messages":"hi"}`, `field "messages" must not be a JSON string`},
		{&messagesProtocol, `{"messages":[["hi"]]}`, `field "messages" must not be a JSON array`},
		{&messagesProtocol, `{"messages":[{"role":true}]}`, `field "messages.role" must not be a JSON bool`},
		{&messagesProtocol, `{"messages":[{"role":"user","content":[{"type":"tool_use","input":{"n":1e400}}]}]}`, `field "messages.content" must not be a JSON number 1e400`},
		{&messagesProtocol, `{"tools":"f"}`, `field "tools" must not be a JSON string`},
		{&messagesProtocol, `{"tools":[{"name":"f","description":{}}]}`, `field "tools.description" must not be a JSON object`},
		{&messagesProtocol, `{"tools":[{"name":"f","input_schema":{"n":1e400}}]}`, `field "tools.input_schema" must not be a JSON number 1e400`},
		{&messagesProtocol, `{"messages":[{"role":"user"}],"messages":7}`, `field "messages" must not be a JSON number`},
	}
	for _, tt := range tests {
		_, err := tt.p.parse(nil, []byte(tt.body))
		var re *protocol.Error
		if !errors.As(err, &re) || re.Msg != "invalid JSON body: "+tt.want {
			t.Errorf("%s(%s) = %v, want %q", tt.p.name, tt.body, err, tt.want)
		}
		if _, ref := tt.p.ref(nil, []byte(tt.body)); ref == nil || err == nil || ref.Error() != err.Error() {
			t.Errorf("%s(%s): reference error %v", tt.p.name, tt.body, ref)
		}
	}
}

// Bodies that are not a JSON object, or are malformed, are rejected with a message that is not a
// type error, even when a field of the wrong type comes first.
func TestParseAgentRejectsWhatIsNotAJSONObject(t *testing.T) {
	bodies := []string{``, " \n", `[]`, `"input"`, `null`, `{"model":"m",`, `{"input":[{"role":"user"}]`, `{"model":5,`,
		`{"input":"x"} {}`, `{"messages":[{"content":"a"},]}`, "{\"input\":\"\x01\"}", `{"input":"\x"}`}
	for _, p := range agentProtocols {
		for _, body := range bodies {
			r, err := p.parse(nil, []byte(body))
			var re *protocol.Error
			if !errors.As(err, &re) || r != nil {
				t.Errorf("%s(%q) = %+v, %v; want an *Error", p.name, body, r, err)
				continue
			}
			if strings.HasPrefix(re.Msg, typeErrorPrefix) || re.Msg == "" {
				t.Errorf("%s(%q): error %q", p.name, body, re.Msg)
			}
		}
	}
}

// A repeated key's last value is the field's value, replacing the earlier one whole, at every
// level; null is the field's absence. Ids keep chat's rules: null or an object leaves the id.
func TestParseAgentRepeatedKeysAndNulls(t *testing.T) {
	tests := []struct {
		p                *agentProtocol
		name, body, same string
	}{
		{&responsesProtocol, "last model wins", `{"model":"a","model":"b"}`, `{"model":"b"}`},
		{&responsesProtocol, "null model clears", `{"model":"a","model":null}`, `{}`},
		{&responsesProtocol, "last store wins", `{"store":false,"store":true}`, `{}`},
		{&responsesProtocol, "null store clears", `{"store":false,"store":null}`, `{}`},
		{&responsesProtocol, "null previous_response_id clears", `{"previous_response_id":"r","previous_response_id":null}`, `{}`},
		{&responsesProtocol, "the last input replaces the earlier whole",
			`{"input":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"input":[{"content":"c"}]}`, `{"input":[{"content":"c"}]}`},
		{&responsesProtocol, "null input clears", `{"input":"x","input":null}`, `{}`},
		{&responsesProtocol, "null instructions clear", `{"instructions":"x","instructions":null,"input":"y"}`, `{"input":"y"}`},
		{&responsesProtocol, "null tools clear", `{"tools":[{"name":"f"}],"tools":null,"input":"y"}`, `{"input":"y"}`},
		{&responsesProtocol, "an item's last content wins", `{"input":[{"role":"user","content":"a","content":"b"}]}`, `{"input":[{"role":"user","content":"b"}]}`},
		{&responsesProtocol, "a null role is none", `{"input":[{"role":"user","role":null,"content":"a"}]}`, `{"input":[{"content":"a"}]}`},
		{&responsesProtocol, "a null type is a message", `{"input":[{"type":"function_call","type":null,"role":"user","content":"a"}]}`,
			`{"input":[{"role":"user","content":"a"}]}`},
		{&responsesProtocol, "a null item is nothing", `{"input":[null,{"role":"user","content":"a"},null]}`, `{"input":[{"role":"user","content":"a"}]}`},
		{&responsesProtocol, "a part's last text wins", `{"input":[{"role":"user","content":[{"type":"input_text","text":"a","text":"b"}]}]}`,
			`{"input":[{"role":"user","content":"b"}]}`},
		{&responsesProtocol, "null id keeps", `{"user":"a","user":null}`, `{"user":"a"}`},
		{&responsesProtocol, "object id keeps", `{"prompt_cache_key":"a","prompt_cache_key":{"x":1}}`, `{"prompt_cache_key":"a"}`},
		{&responsesProtocol, "conversation object replaces", `{"conversation":"a","conversation":{"x":1}}`, `{}`},
		{&responsesProtocol, "conversation null keeps", `{"conversation":{"id":"a"},"conversation":null}`, `{"conversation":"a"}`},
		{&messagesProtocol, "last model wins", `{"model":"a","model":"b"}`, `{"model":"b"}`},
		{&messagesProtocol, "the last messages replace the earlier whole",
			`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"messages":[{"content":"c"}]}`, `{"messages":[{"content":"c"}]}`},
		{&messagesProtocol, "null messages clear", `{"messages":[],"messages":null}`, `{}`},
		{&messagesProtocol, "null system clears", `{"system":"s","system":null,"messages":[]}`, `{"messages":[]}`},
		{&messagesProtocol, "a message's last role wins", `{"messages":[{"role":"user","role":"assistant","content":"a"}]}`,
			`{"messages":[{"role":"assistant","content":"a"}]}`},
		{&messagesProtocol, "a null message is nothing", `{"messages":[null,{"role":"user","content":"a"}]}`, `{"messages":[{"role":"user","content":"a"}]}`},
		{&messagesProtocol, "a block's last type wins", `{"messages":[{"role":"user","content":[{"type":"image","type":"text","text":"a"}]}]}`,
			`{"messages":[{"role":"user","content":"a"}]}`},
		{&messagesProtocol, "metadata not an object clears", `{"metadata":{"user_id":"u"},"metadata":"x"}`, `{}`},
		{&messagesProtocol, "metadata null user_id keeps", `{"metadata":{"user_id":"u","user_id":null}}`, `{"metadata":{"user_id":"u"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.p.name+"/"+tt.name, func(t *testing.T) {
			if got, want := mustParseAs(t, tt.p, nil, tt.body), mustParseAs(t, tt.p, nil, tt.same); protocol.Routing(got) != protocol.Routing(want) {
				t.Errorf("%s\n got  %+v\n want %+v", tt.body, got, want)
			}
		})
	}
}

// Object keys are matched exactly, as Parse matches them.
func TestParseAgentKeysAreCaseSensitive(t *testing.T) {
	for _, tt := range []struct {
		p    *agentProtocol
		body string
	}{
		{&responsesProtocol, `{"Model":"m","INPUT":"x","Store":false,"User":"u"}`},
		{&messagesProtocol, `{"Model":"m","Messages":[],"Metadata":{"user_id":"u"}}`},
	} {
		if r := mustParseAs(t, tt.p, nil, tt.body); protocol.Routing(r) != (protocol.Request{}) {
			t.Errorf("%s(%s): a key spelled otherwise was read: %+v", tt.p.name, tt.body, r)
		}
	}
}

// A Responses body's session key: session_params.session_id, the session headers, conversation
// (a string, or an object's id), prompt_cache_key, then the user-scoped x-user-id header and user.
func TestResponsesSessionKeyPrecedence(t *testing.T) {
	checkKeyPrecedence(t, `"input":"hi"`, slices.Concat(
		[]keySource{{body: `"session_params":{"session_id":"sp"}`, value: "session:sp"}},
		sessionHeaderSources,
		[]keySource{
			{body: `"conversation":"conv"`, value: "session:conv"},
			{body: `"prompt_cache_key":"pck"`, value: "session:pck"},
			{header: "x-user-id", value: "user:xu"},
			{body: `"user":"bw"`, value: "user:bw"},
		},
	), func(h http.Header, body string) *protocol.Request { return mustParseAs(t, &responsesProtocol, h, body) })
	for body, want := range map[string]string{
		`{"conversation":{"id":"conv_1"}}`:                          "session:conv_1",
		`{"conversation":{"id":7}}`:                                 "session:7",
		`{"conversation":{"x":"conv_1"},"prompt_cache_key":"k"}`:    "session:k",
		`{"conversation":"  ","prompt_cache_key":" k "}`:            "session:k",
		`{"session_id":"s","user_id":"u","metadata":{"user_id":1}}`: "",
	} {
		if r := mustParseAs(t, &responsesProtocol, nil, body); r.SessionKey != want {
			t.Errorf("%s: SessionKey = %q, want %q", body, r.SessionKey, want)
		}
	}
}

// A Messages body's session key: the session headers (Claude Code's among them), then
// metadata.user_id, session-scoped, then the user-scoped x-user-id header.
func TestMessagesSessionKeyPrecedence(t *testing.T) {
	checkKeyPrecedence(t, `"messages":[{"role":"user","content":"hi"}]`, slices.Concat(
		sessionHeaderSources,
		[]keySource{
			{body: `"metadata":{"user_id":"user_abc_session_1"}`, value: "session:user_abc_session_1"},
			{header: "x-user-id", value: "user:xu"},
		},
	), func(h http.Header, body string) *protocol.Request { return mustParseAs(t, &messagesProtocol, h, body) })
	// Neither chat's body ids nor a top-level user_id are Messages fields.
	r := mustParseAs(t, &messagesProtocol, nil, `{"user":"u","user_id":"u","session_id":"s","session_params":{"session_id":"p"}}`)
	if r.SessionKey != "" || r.HashKey != "" {
		t.Errorf("ids read from fields Messages does not have: %+v", r)
	}
}

// The hash policies' key: the id headers, then the body's ids, then the history key.
func TestAgentHashKey(t *testing.T) {
	tests := []struct {
		p    *agentProtocol
		name string
		h    http.Header
		body string
		want string
	}{
		{&responsesProtocol, "header first", testkit.Header("x-request-id", "r"), `{"conversation":"c","input":"hi"}`, "r"},
		{&responsesProtocol, "then conversation", nil, `{"conversation":{"id":"c"},"prompt_cache_key":"k","user":"u","input":"hi"}`, "c"},
		{&responsesProtocol, "then prompt_cache_key", nil, `{"prompt_cache_key":"k","user":"u","input":"hi"}`, "k"},
		{&responsesProtocol, "then user", nil, `{"user":"u","input":"hi"}`, "u"},
		{&responsesProtocol, "then the history key", nil, `{"input":"hi"}`, spelled("uchi·.")},
		{&messagesProtocol, "header first", testkit.Header("x-trace-id", "t"), `{"metadata":{"user_id":"m"},"messages":[]}`, "t"},
		{&messagesProtocol, "then metadata.user_id", nil, `{"metadata":{"user_id":" m "},"messages":[]}`, "m"},
		{&messagesProtocol, "then the history key", nil, `{"messages":[{"role":"user","content":"hi"}]}`, spelled("uchi·.")},
	}
	for _, tt := range tests {
		t.Run(tt.p.name+"/"+tt.name, func(t *testing.T) {
			if r := mustParseAs(t, tt.p, tt.h, tt.body); r.HashKey != tt.want {
				t.Errorf("HashKey = %q, want %q", r.HashKey, tt.want)
			}
		})
	}
}

// ParseModel reads model and stream of any JSON object, and nothing else: no key of any kind.
func TestParseModel(t *testing.T) {
	h := testkit.Header("x-session-id", "s", "x-user-id", "u")
	tests := []struct {
		body   string
		model  string
		stream bool
	}{
		{`{"model":"bge","input":["a","b"]}`, "bge", false},
		{`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"user":"u"}`, "m", true},
		{`{"model":null,"stream":null}`, "", false},
		{`{"model":"a","model":"b"}`, "b", false},
		{`{"Model":"m"}`, "", false},
		{`{"model":"m","input":5,"messages":"x","tools":{},"prompt":[1e400],"text":{"a":[true,null]}}`, "m", false},
		{` {} `, "", false},
	}
	for _, tt := range tests {
		r, err := protocol.ParseModel(h, []byte(tt.body))
		if err != nil {
			t.Errorf("ParseModel(%s): %v", tt.body, err)
			continue
		}
		if *r != (protocol.Request{Model: tt.model, Stream: tt.stream}) {
			t.Errorf("ParseModel(%s) = %+v, want model %q stream %v and nothing else", tt.body, r, tt.model, tt.stream)
		}
	}
	for body, want := range map[string]string{
		``:                                   "request body is empty; expected a JSON object",
		`[{"model":"m"}]`:                    "request body must be a JSON object",
		`{"model":5}`:                        `invalid JSON body: field "model" must not be a JSON number`,
		`{"stream":"yes"}`:                   `invalid JSON body: field "stream" must not be a JSON string`,
		`{"model":"m","input":[{"a":}]}`:     "invalid JSON body: invalid character '}' at offset 27",
		`{"model":"m","input":[{"a":"\q"}]}`: "invalid JSON body: invalid character 'q' at offset 29",
		`{"model":"m"} x`:                    "invalid JSON body: invalid character 'x' at offset 14",
	} {
		r, err := protocol.ParseModel(nil, []byte(body))
		var re *protocol.Error
		if !errors.As(err, &re) || r != nil {
			t.Errorf("ParseModel(%s) = %+v, %v; want an *Error", body, r, err)
		} else if re.Msg != want {
			t.Errorf("ParseModel(%s): %q, want %q", body, re.Msg, want)
		}
	}
}

// The Request owns its strings: the history key goes into a long-lived tree, so nothing in it may
// point into (and keep alive) the request body, which the server reuses.
func TestParseAgentResultDoesNotAliasBody(t *testing.T) {
	bodies := map[*agentProtocol]string{
		&responsesProtocol: `{"model":"m","previous_response_id":"resp_1","conversation":{"id":"c"},"instructions":"i","tools":[{"type":"function","name":"f","parameters":{"a":1}},{"type":"web_search"}],"input":[{"role":"user","content":"hello"},{"type":"reasoning","encrypted_content":"e"}]}`,
		&messagesProtocol:  `{"model":"m","metadata":{"user_id":"u"},"system":"s","tools":[{"name":"f","input_schema":{"a":1}}],"messages":[{"role":"user","content":[{"type":"text","text":"hello"},{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`,
	}
	for p, s := range bodies {
		body := []byte(s)
		r, err := p.parse(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		before := protocol.Request{Model: strings.Clone(r.Model), Stream: r.Stream, Chat: r.Chat,
			SessionKey: strings.Clone(r.SessionKey), HashKey: strings.Clone(r.HashKey), Text: strings.Clone(r.Text),
			PreviousResponseID: strings.Clone(r.PreviousResponseID), NoStore: r.NoStore}
		for i := range body {
			body[i] = 'Z'
		}
		if protocol.Routing(r) != before {
			t.Errorf("%s: overwriting the body changed the request:\n%+v\n%+v", p.name, before, *r)
		}
	}
}
