package protocol_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// fieldNames are every object key Parse reads, at any level.
var fieldNames = []string{
	"model", "stream", "messages", "tools", "prompt", "text", "input_ids", "session_params",
	"session_id", "user_id", "user", "role", "name", "content", "tool_calls", "tool_call_id",
	"function", "arguments", "description", "parameters", "type", "add_special_tokens", "cache_salt",
}

// exactKeys reports whether no object key in the valid JSON document body is another spelling of a
// field name under encoding/json's case folding: the only bodies on which Parse deliberately
// differs from the encoding/json reference. It reads tokens, not a decoded value, so that the
// keys of a value a repeated key replaced are seen too.
func exactKeys(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type container struct{ object, wantKey bool }
	var open []container
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		if n := len(open); n > 0 && open[n-1].wantKey {
			if k, ok := tok.(string); ok {
				for _, name := range fieldNames {
					if k != name && strings.EqualFold(k, name) {
						return false
					}
				}
				open[n-1].wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			open = append(open, container{object: true, wantKey: true})
			continue
		case json.Delim('['):
			open = append(open, container{})
			continue
		case json.Delim('}'), json.Delim(']'):
			open = open[:len(open)-1]
		}
		// A value ended: an object holding it expects a key next.
		if n := len(open); n > 0 && open[n-1].object {
			open[n-1].wantKey = true
		}
	}
}

const typeErrorPrefix = "invalid JSON body: field "

// referenceMismatch says how a reader's result (got, err) differs from its encoding/json
// reference's (want, refErr): one of them failing alone, errors that sameError does not count as
// the same, or different Requests. It is "" when they agree; the readers' differential tests and
// fuzz targets all judge agreement by it.
func referenceMismatch(got *protocol.Request, err error, want *protocol.Request, refErr error, sameError func(err, refErr error) bool) string {
	switch {
	case (err == nil) != (refErr == nil):
		return fmt.Sprintf("error %v, reference error %v", err, refErr)
	case err != nil:
		if !sameError(err, refErr) {
			return fmt.Sprintf("error %q, reference error %q", err, refErr)
		}
	case protocol.Routing(got) != protocol.Routing(want):
		return fmt.Sprintf("\n got  %+v\n want %+v", got, want)
	}
	return ""
}

// sameErrorText counts two errors as the same when their texts are: the chat reader's errors
// match its reference's word for word.
func sameErrorText(err, refErr error) bool { return err.Error() == refErr.Error() }

// FuzzParseMatchesEncodingJSON: Parse accepts exactly the bodies that are valid JSON objects (but
// for fields of the wrong type), and on a body whose keys are spelled exactly it derives the same
// Request, or fails with the same type error, as the encoding/json reference.
func FuzzParseMatchesEncodingJSON(f *testing.F) {
	parseSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, session string) {
		h := http.Header{}
		if session != "" {
			h.Set("x-session-id", session)
		}
		got, err := protocol.ParseChat(h, body)
		want, refErr := refParse(h, body)
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		valid := json.Valid(body) && len(trimmed) > 0 && trimmed[0] == '{'
		switch {
		case !valid:
			if err == nil {
				t.Fatalf("accepted an invalid body %q: %+v", body, got)
			}
			if strings.HasPrefix(err.Error(), typeErrorPrefix) {
				t.Fatalf("invalid body %q reported as a type error: %v", body, err)
			}
		case !exactKeys(body):
			if err != nil && !strings.HasPrefix(err.Error(), typeErrorPrefix) {
				t.Fatalf("valid body %q rejected: %v", body, err)
			}
		default:
			if m := referenceMismatch(got, err, want, refErr, sameErrorText); m != "" {
				t.Fatalf("body %q: %s", body, m)
			}
		}
	})
}

// Object keys are matched exactly: another spelling is an unknown field, as vLLM reads it.
func TestParseKeysAreCaseSensitive(t *testing.T) {
	tests := []struct {
		name, body string
	}{
		{"model", `{"Model":"m","prompt":"p"}`},
		{"user", `{"USER":"u","prompt":"p"}`},
		{"messages", `{"Messages":[{"role":"user","content":"hi"}],"prompt":"p"}`},
		{"session_params", `{"session_params":{"Session_ID":"s"},"prompt":"p"}`},
		{"wrong type under another spelling", `{"MODEL":5,"Stream":"yes","prompt":"p"}`},
		{"folded long s", `{"ſession_id":"s","prompt":"p"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParse(t, nil, tt.body)
			if r.Model != "" || r.Stream || r.Chat || r.SessionKey != "" || r.HashKey != "p" || r.Text != "p" {
				t.Errorf("a key spelled otherwise was read: %+v", r)
			}
		})
	}
	r := mustParse(t, nil, `{"messages":[{"Role":"user","CONTENT":"hi"}]}`)
	if want := mustParse(t, nil, `{"messages":[{}]}`); protocol.Routing(r) != protocol.Routing(want) {
		t.Errorf("message keys spelled otherwise were read: %+v", r)
	}
}

// A repeated key is decoded over what the earlier one left, as encoding/json does.
func TestParseRepeatedKeys(t *testing.T) {
	tests := []struct {
		name, body, same string
	}{
		{"last model wins", `{"model":"a","model":"b"}`, `{"model":"b"}`},
		{"null model clears", `{"model":"a","model":null}`, `{}`},
		{"null id keeps", `{"user":"a","user":null}`, `{"user":"a"}`},
		{"object id keeps", `{"user":"a","user":{"x":1}}`, `{"user":"a"}`},
		{"messages merge element-wise",
			`{"messages":[{"role":"user","name":"n","content":"a"}],"messages":[{"content":"b"}]}`,
			`{"messages":[{"role":"user","name":"n","content":"b"}]}`},
		{"a shorter repeat cuts",
			`{"messages":[{"content":"a"},{"content":"b"}],"messages":[{"role":"tool"}]}`,
			`{"messages":[{"role":"tool","content":"a"}]}`},
		{"a cut element comes back",
			`{"messages":[{"content":"a"},{"content":"b"}],"messages":[{}],"messages":[{},{"role":"user"}]}`,
			`{"messages":[{"content":"a"},{"role":"user","content":"b"}]}`},
		{"an empty repeat forgets",
			`{"messages":[{"content":"a"},{"content":"b"}],"messages":[],"messages":[{},{"role":"user"}]}`,
			`{"messages":[{},{"role":"user"}]}`},
		{"null messages is not chat", `{"messages":[{"content":"a"}],"messages":null,"prompt":"p"}`, `{"prompt":"p"}`},
		{"last session_params wins", `{"session_params":{"session_id":"a"},"session_params":7}`, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := mustParse(t, nil, tt.body), mustParse(t, nil, tt.same); protocol.Routing(got) != protocol.Routing(want) {
				t.Errorf("%s\n got  %+v\n want %+v", tt.body, got, want)
			}
			ref, err := refParse(nil, []byte(tt.body))
			if err != nil || protocol.Routing(ref) != protocol.Routing(mustParse(t, nil, tt.body)) {
				t.Errorf("the encoding/json reference reads %s otherwise: %+v %v", tt.body, ref, err)
			}
		})
	}
}

// Type errors name the field, in encoding/json's words.
func TestParseTypeErrorMessages(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"model":5}`, `field "model" must not be a JSON number`},
		{`{"messages":[{"role":true}]}`, `field "messages.role" must not be a JSON bool`},
		{`{"tools":[{"function":{"name":{}}}]}`, `field "tools.function.name" must not be a JSON object`},
		{`{"prompt":[1e400]}`, `field "prompt" must not be a JSON number 1e400`},
		{`{"model":5,"stream":"x"}`, `field "model" must not be a JSON number`},
	}
	for _, tt := range tests {
		_, err := protocol.ParseChat(nil, []byte(tt.body))
		if err == nil || err.Error() != "invalid JSON body: "+tt.want {
			t.Errorf("Parse(%s) = %v, want %q", tt.body, err, tt.want)
		}
		if _, ref := refParse(nil, []byte(tt.body)); ref == nil || ref.Error() != err.Error() {
			t.Errorf("Parse(%s): reference error %v", tt.body, ref)
		}
	}
}

// randomDoc builds a JSON object biased towards the fields Parse reads, in every type, repeated,
// nested and null, with the escapes, surrogates and invalid UTF-8 the fuzzer finds slowly.
func randomDoc(r *rand.Rand) []byte {
	strs := []string{`""`, `"user"`, `"assistant"`, `"tool"`, `"text"`, `"input_text"`, `"image_url"`, `"a b"`,
		`"\u00e9\n"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00\ud83d x"`, "\"\xff\xc3(\"", `"\"\\\/"`, `"{\"b\":1,\"a\":2}"`, `" s "`,
		"\"\u2028\xe2\x80\xa9\"", `"\u2028"`}
	nums := []string{"0", "-0", "7", "-1.5e3", "1E2", "0.25", "151643", "1e400", "-1e309", "12345678901234567890",
		"1e20", "-1.2345678901234567e-7", "5e-324", "-0.0"}
	keys := append(slices.Clone(fieldNames), "x", "id", "image_url", "")
	var value func(depth int, key string) string
	object := func(depth int, names ...string) string { return randObject(r, 5, 4, keys, names, depth, value) }
	array := func(_ int, elem func() string) string { return randArray(r, elem) }
	value = func(depth int, key string) string {
		if depth < 6 && r.IntN(3) > 0 {
			// The shape the field has in a request.
			switch key {
			case "messages":
				return array(depth, func() string { return object(depth+1, "role", "name", "content", "tool_calls", "tool_call_id") })
			case "tools":
				return array(depth, func() string { return object(depth+1, "type", "function") })
			case "tool_calls":
				return array(depth, func() string { return object(depth+1, "function") })
			case "function":
				return object(depth, "name", "arguments", "description", "parameters")
			case "content":
				if r.IntN(2) == 0 {
					return array(depth, func() string { return object(depth+1, "type", "text") })
				}
				return strs[r.IntN(len(strs))]
			case "session_params":
				return object(depth, "session_id")
			case "role", "name", "tool_call_id", "text", "type", "description", "model", "session_id", "user":
				return strs[r.IntN(len(strs))]
			}
		}
		return randAny(r, depth, func() string { return strs[r.IntN(len(strs))] }, nums,
			func() string { return array(depth, func() string { return value(depth+1, "") }) },
			func() string { return object(depth, "x") })
	}
	return randTop(r, keys, []string{"messages", "tools", "prompt", "user"}, value)
}

// randObject is a JSON object of fewer than members members, each under a key from names but
// one time in named from keys, its value drawn by value one level deeper than depth.
func randObject(r *rand.Rand, members, named int, keys, names []string, depth int, value func(depth int, key string) string) string {
	var ms []string
	for range r.IntN(members) {
		k := keys[r.IntN(len(keys))]
		if r.IntN(named) > 0 {
			k = names[r.IntN(len(names))]
		}
		ms = append(ms, `"`+k+`":`+value(depth+1, k))
	}
	return "{" + strings.Join(ms, ",") + "}"
}

// randArray is a JSON array of up to three elements drawn by elem.
func randArray(r *rand.Rand, elem func() string) string {
	var els []string
	for range r.IntN(4) {
		els = append(els, elem())
	}
	return "[" + strings.Join(els, ",") + "]"
}

// randAny is a value under a key of no known shape: text three times in ten, else a number, a
// literal, and shallower than depth 6 an array or an object, drawn by the functions given.
func randAny(r *rand.Rand, depth int, text func() string, nums []string, array, object func() string) string {
	switch n := r.IntN(10); {
	case n < 3:
		return text()
	case n < 4:
		return nums[r.IntN(len(nums))]
	case n < 5:
		return []string{"true", "false", "null"}[r.IntN(3)]
	case depth > 5:
		return "null"
	case n < 7:
		return array()
	default:
		return object()
	}
}

// randTop is a document of one to six members, each under a key from top or, half the time, from
// main, its value drawn by value at depth 1.
func randTop(r *rand.Rand, top, main []string, value func(depth int, key string) string) []byte {
	var ms []string
	for range 1 + r.IntN(6) {
		k := top[r.IntN(len(top))]
		if r.IntN(2) == 0 {
			k = main[r.IntN(len(main))]
		}
		ms = append(ms, `"`+k+`":`+value(1, k))
	}
	return []byte("{" + strings.Join(ms, ",") + "}")
}

// Parse and the encoding/json reference agree on many random bodies shaped like requests.
func TestParseMatchesReferenceOnRandomBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	n := orShort(200000)
	ok, chats := 0, 0
	for range n {
		body := randomDoc(r)
		got, err := protocol.ParseChat(nil, body)
		want, refErr := refParse(nil, body)
		if m := referenceMismatch(got, err, want, refErr, sameErrorText); m != "" {
			t.Fatalf("body %s: %s", body, m)
		}
		if err == nil {
			ok++
			if got.Chat && got.Text != "" {
				chats++
			}
		}
	}
	if ok < n/10 || chats < n/100 {
		t.Fatalf("only %d of %d bodies parsed, %d chats with a key: the generator is too narrow", ok, n, chats)
	}
	t.Logf("%d of %d bodies parsed, %d chats with a key", ok, n, chats)
}

// The Request owns its strings: the history key goes into a long-lived tree, so nothing in it may
// point into (and keep alive) the request body, which the server reuses.
func TestParseResultDoesNotAliasBody(t *testing.T) {
	bodies := []string{
		`{"model":"m","user":"u","session_id":"s","messages":[{"role":"user","name":"n","content":"hello"},{"role":"x","content":["a",{"type":"text","text":"b"}]}],"tools":[{"function":{"name":"f","description":"d","parameters":{"p":1}}}]}`,
		`{"prompt":"a prompt","user_id":42,"session_params":{"session_id":"p"}}`,
		`{"text":["t1","t2"]}`,
	}
	for _, s := range bodies {
		body := []byte(s)
		r, err := protocol.ParseChat(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		before := protocol.Request{Model: strings.Clone(r.Model), Stream: r.Stream, Chat: r.Chat,
			SessionKey: strings.Clone(r.SessionKey), HashKey: strings.Clone(r.HashKey), Text: strings.Clone(r.Text)}
		for i := range body {
			body[i] = 'Z'
		}
		if protocol.Routing(r) != before {
			t.Errorf("overwriting the body changed the request parsed from %s:\n%+v\n%+v", s, before, *r)
		}
	}
}

func TestExactKeys(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`, true},
		{`{"Model":"m"}`, false},
		{`{"x":{"y":[{"ROLE":1}]}}`, false},
		{`{"tools":[{"fUnCtion":{}}],"tools":[{}]}`, false},
		{`{"a":"Model","b":["USER"]}`, true},
		{`{"ſession_id":1}`, false},
		{`{"models":1,"":2}`, true},
	}
	for _, tt := range tests {
		if got := exactKeys([]byte(tt.body)); got != tt.want {
			t.Errorf("exactKeys(%s) = %v, want %v", tt.body, got, tt.want)
		}
	}
}
