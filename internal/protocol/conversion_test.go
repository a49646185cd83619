package protocol_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// refConvertedBody is the /tokenize query of a Responses or Messages body (p) as the reference
// conversion writes it (conversion_reference_test.go).
func refConvertedBody(p *agentProtocol, body []byte, model string) ([]byte, bool) {
	convert := CFResponses
	if p == &messagesProtocol {
		convert = CFMessages
	}
	chat, err := convert(body)
	if err != nil {
		return nil, false
	}
	messages, tools, err := chat.Encode()
	if err != nil {
		return nil, false
	}
	var ask bytes.Buffer
	enc := json.NewEncoder(&ask)
	enc.SetEscapeHTML(false)
	err = enc.Encode(struct {
		Model               string          `json:"model"`
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools,omitempty"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
	}{model, messages, tools, true})
	return ask.Bytes(), err == nil
}

// checkConverted checks the query of a body of p that parses against the reference, and reports
// whether one was rendered.
func checkConverted(t testing.TB, p *agentProtocol, body []byte) bool {
	r, err := p.parse(nil, body)
	if err != nil {
		return false
	}
	got, ok := r.AppendTokenizeBody(nil, body, "m")
	want, wantOK := refConvertedBody(p, body, "m")
	if ok != wantOK || !bytes.Equal(got, want) {
		t.Fatalf("%s body %s:\nquery     %s %v\nreference %s %v", p.name, body, got, ok, want, wantOK)
	}
	return ok
}

// The queries of Responses and Messages bodies are those of the reference, on bodies drawn to
// convert (but for a departure here and there) and on bodies drawn from anything a request holds.
func TestConversionMatchesReferenceOnRandomBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	n := orShort(40000)
	for _, p := range agentProtocols {
		converted := 0
		for range n {
			if checkConverted(t, p, randomConvertible(r, p)) {
				converted++
			}
			checkConverted(t, p, randomAgentDoc(r, p))
		}
		t.Logf("%s: %d of %d bodies converted", p.name, converted, n)
		if converted < n/10 {
			t.Fatalf("%s: only %d of %d bodies converted: the generator is too narrow", p.name, converted, n)
		}
	}
}

// FuzzConversion: the queries of Responses (protocol even) and Messages (odd) bodies are those of
// the reference.
func FuzzConversion(f *testing.F) {
	r := rand.New(rand.NewPCG(13, 14))
	for i := range 8 {
		f.Add(randomConvertible(r, agentProtocols[i%2]), uint8(i))
	}
	f.Fuzz(func(t *testing.T, body []byte, p uint8) { checkConverted(t, agentProtocols[p%2], body) })
}

// A Messages body converts as vLLM converts it: the system's text blocks joined (Claude Code's
// billing header left out), a user's tool results first, as tool messages, then its text; an
// assistant's text and tool calls, the input written as Python writes JSON; client tools as
// function tools.
func TestMessagesConvertAsVLLMConvertsThem(t *testing.T) {
	body := `{"model":"claude","max_tokens":5,
		"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"Be <brief>."}],
		"tools":[{"name":"grep","description":"search","input_schema":{"type":"object"}}],
		"messages":[{"role":"user","content":"find it"},
			{"role":"assistant","content":[{"type":"text","text":"looking"},{"type":"tool_use","id":"t1","name":"grep","input":{"q":"é","n":1.0,"q":"x"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"type":"text","text":"and?"}]}]}`
	want := `{"model":"m","messages":[{"role":"system","content":"Be <brief>."},{"role":"user","content":"find it"},` +
		`{"role":"assistant","content":"looking","tool_calls":[{"id":"t1","type":"function","function":{"name":"grep","arguments":"{\"q\": \"x\", \"n\": 1.0}"}}]},` +
		`{"role":"tool","content":"a\nb","tool_call_id":"t1"},{"role":"user","content":"and?"}],` +
		`"tools":[{"type":"function","function":{"name":"grep","description":"search","parameters":{"type":"object"}}}],"add_generation_prompt":true}` + "\n"
	checkQuery(t, protocol.ParseMessages, body, want)
}

// A Responses body converts as vLLM converts it: the instructions as a system message, function
// calls joining the assistant message before them, their outputs as tool messages.
func TestResponsesConvertAsVLLMConvertsThem(t *testing.T) {
	body := `{"model":"gpt","instructions":"Be brief.","tools":[{"type":"function","name":"grep","parameters":{"type":"object"}}],
		"input":[{"role":"user","content":[{"type":"input_text","text":"find it"}]},
			{"type":"function_call","call_id":"c1","name":"grep","arguments":"{\"q\":\"x\"}"},
			{"type":"message","role":"assistant","content":[{"type":"output_text","text":"calling"}]},
			{"type":"function_call_output","call_id":"c1","output":"found"}]}`
	want := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"find it"}]},` +
		`{"role":"assistant","content":"calling","tool_calls":[{"id":"c1","type":"function","function":{"name":"grep","arguments":"{\"q\":\"x\"}"}}]},` +
		`{"role":"tool","content":"found","tool_call_id":"c1"}],` +
		`"tools":[{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}],"add_generation_prompt":true}` + "\n"
	checkQuery(t, protocol.ParseResponses, body, want)
}

func checkQuery(t *testing.T, parse func(h reqkey.Header, raw []byte) (*protocol.Request, error), body, want string) {
	t.Helper()
	r, err := parse(nil, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := r.AppendTokenizeBody(nil, []byte(body), "m")
	if !ok || string(got) != want {
		t.Errorf("query\n%s %v\nwant\n%s", got, ok, want)
	}
}

// randomConvertible draws a body of p shaped to convert, but for a departure here and there: a
// value of another type, a repeated key, a type, role or member the conversion refuses.
func randomConvertible(r *rand.Rand, p *agentProtocol) []byte {
	g := convGen{r}
	if p == &messagesProtocol {
		return []byte(g.obj(`"model":"m"`, `"max_tokens":5`,
			g.opt(3, `"system":`+g.either(g.str, func() string { return g.arr(3, g.systemBlock) })),
			`"messages":`+g.arr(-4, g.anthropicMessage),
			g.opt(3, `"tools":`+g.arr(3, func() string { return g.tool("input_schema", `"custom"`, `"web_search_20250305"`) })),
			g.opt(4, `"tool_choice":`+g.obj(`"type":`+g.pick(`"auto"`, `"any"`, `"none"`))),
			g.rare(20, `"chat_template_kwargs":`+g.pick(`null`, `{}`))))
	}
	return []byte(g.obj(`"model":"m"`,
		g.opt(3, `"instructions":`+g.str()),
		`"input":`+g.either(g.str, func() string { return g.arr(4, g.item) }),
		g.opt(3, `"tools":`+g.arr(3, func() string { return g.tool("parameters", `"function"`, `"web_search"`) })),
		g.opt(4, `"tool_choice":`+g.pick(`"none"`, `"auto"`, `{"type":"function","name":"f"}`)),
		g.rare(20, `"previous_response_id":`+g.pick(`null`, `"resp_1"`)),
		g.rare(20, `"conversation":`+g.pick(`null`, `"conv_1"`))))
}

// convGen draws the parts of the bodies randomConvertible builds.
type convGen struct{ r *rand.Rand }

func (g convGen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }

// value is v, or once in a while a value of any other type.
func (g convGen) value(v string) string {
	if g.r.IntN(60) == 0 {
		return g.pick(`null`, `7`, `true`, `{}`, `[]`, `"s"`, `{"type":"text"}`)
	}
	return v
}

// obj is an object of the members given ("" ones left out), each value now and then replaced
// (see value), and now and then a member repeated with another value, before or after it.
func (g convGen) obj(members ...string) string {
	var ms []string
	for _, m := range members {
		if m == "" {
			continue
		}
		key, val, _ := strings.Cut(m, ":")
		m = key + ":" + g.value(val)
		switch g.r.IntN(25) {
		case 0:
			ms = append(ms, key+":"+g.pick(`null`, `"other"`, `[]`), m)
		case 1:
			ms = append(ms, m, key+":null")
		default:
			ms = append(ms, m)
		}
	}
	return "{" + strings.Join(ms, g.pick(",", " , ")) + "}"
}

// opt is member but one time in n, then nothing.
func (g convGen) opt(n int, member string) string {
	if g.r.IntN(n) == 0 {
		return ""
	}
	return member
}

// rare is member one time in n, else nothing.
func (g convGen) rare(n int, member string) string {
	if g.r.IntN(n) == 0 {
		return member
	}
	return ""
}

func (g convGen) either(a, b func() string) string {
	if g.r.IntN(2) == 0 {
		return a()
	}
	return b()
}

// arr is an array of up to n elements, or of 1 to -n.
func (g convGen) arr(n int, elem func() string) string {
	var size int
	if n < 0 {
		size = 1 + g.r.IntN(-n)
	} else {
		size = g.r.IntN(n + 1)
	}
	els := make([]string, size)
	for i := range els {
		els[i] = elem()
	}
	return "[" + strings.Join(els, ",") + "]"
}

// str is a string of text: empty, escaped, beyond ASCII, holding what encoding/json escapes, or
// invalid UTF-8.
func (g convGen) str() string {
	return g.pick(`""`, `"find the bug"`, `"a <b> & c"`, `"x-anthropic-billing-header: cch=2;"`, `"\u00e9\n\t\"q\""`,
		`"\ud83d\ude00"`, `"\ud83d"`, "\"\u2028\"", "\"\xff\"", `"\/\\"`, `"日本"`, `"\u0000"`)
}

func (g convGen) systemBlock() string {
	return g.obj(`"type":`+g.pick(`"text"`, `"text"`, `"text"`, `"text"`, `"text"`, `"image"`), `"text":`+g.str(), g.opt(3, `"cache_control":{"type":"ephemeral"}`))
}

func (g convGen) anthropicMessage() string {
	role := g.pick(`"user"`, `"assistant"`, `"user"`, `"assistant"`, `"user"`, `"assistant"`, `"user"`, `"assistant"`, `"system"`)
	content := g.either(g.str, func() string { return g.arr(4, func() string { return g.block(role) }) })
	return g.obj(`"role":`+role, g.opt(10, `"content":`+content))
}

// block is a content block of a message of role: mostly one that role may hold.
func (g convGen) block(role string) string {
	n := g.r.IntN(12)
	switch {
	case n < 4:
		return g.obj(`"type":"text"`, `"text":`+g.str(), g.opt(3, `"cache_control":{"type":"ephemeral"}`))
	case n < 8 && (role == `"assistant"`) != (n == 4):
		return g.obj(`"type":"tool_use"`, `"id":`+g.pick(`"t1"`, `"t2"`, `"t3"`, `""`), `"name":`+g.pick(`"grep"`, `""`, `"read"`), g.opt(6, `"input":`+g.pyObject(3)))
	case n < 8:
		results := func() string {
			return g.arr(3, func() string { return g.obj(`"type":`+g.pick(`"text"`, `"text"`, `"image"`), `"text":`+g.str()) })
		}
		return g.obj(`"type":"tool_result"`, `"tool_use_id":`+g.pick(`"t1"`, `"t2"`), g.opt(4, `"content":`+g.either(g.str, results)), g.rare(4, `"is_error":true`))
	case n < 10:
		return g.obj(`"type":"redacted_thinking"`, `"data":"abc"`)
	case n < 11:
		return g.obj(`"type":`+g.pick(`"thinking"`, `"image"`, `"document"`), `"thinking":"hm"`)
	}
	return g.obj(`"type":"text"`, `"text":`+g.str())
}

// pyObject is a tool_use input: keys repeated, numbers Python writes otherwise, escapes.
func (g convGen) pyObject(depth int) string {
	var ms []string
	for range g.r.IntN(4) {
		ms = append(ms, g.pick(`"q"`, `"n"`, `"é"`, `"\u0071"`, `"\ud800"`, `"k"`)+":"+g.pyValue(depth-1))
	}
	return "{" + strings.Join(ms, ",") + "}"
}

func (g convGen) pyValue(depth int) string {
	switch n := g.r.IntN(6); {
	case n == 0 && depth > 0:
		return g.pyObject(depth)
	case n == 1 && depth > 0:
		return g.arr(3, func() string { return g.pyValue(depth - 1) })
	case n == 2:
		return g.pick(`1.0`, `2.5e-7`, `1e16`, `-0`, `-0.0`, `12345678901234567890`, `0.1`, `1e-320`, `7`)
	case n == 3:
		return g.pick(`true`, `false`, `null`)
	}
	return g.str()
}

// tool is a tool whose schema is under the key schema, of the function type given or another.
func (g convGen) tool(schema, function, other string) string {
	return g.obj(g.opt(3, `"type":`+g.pick(function, function, function, other)), `"name":`+g.pick(`"grep"`, `"read"`, `"grep"`, `"read"`, `""`),
		g.opt(2, `"description":`+g.str()), g.opt(3, `"`+schema+`":`+g.pick(`{"type":"object","properties":{}}`, `{ "type" : "object" }`, `[]`)),
		g.rare(20, `"defer_loading":true`))
}

func (g convGen) item() string {
	parts := func() string {
		return g.arr(3, func() string {
			return g.obj(`"type":`+g.pick(`"input_text"`, `"output_text"`, `"input_text"`, `"output_text"`, `"refusal"`), `"text":`+g.str())
		})
	}
	switch g.r.IntN(12) {
	case 0, 1, 2, 3, 4:
		return g.obj(g.opt(2, `"type":"message"`), `"role":`+g.pick(`"user"`, `"assistant"`, `"system"`, `"developer"`, `"user"`, `"assistant"`, `"tool"`),
			g.rare(8, `"status":`+g.pick(`"completed"`, `"in_progress"`, `"incomplete"`)), g.opt(10, `"content":`+g.either(g.str, parts)))
	case 5, 6, 7:
		return g.obj(`"type":"function_call"`, `"call_id":`+g.pick(`"c1"`, `"c2"`, `"c3"`, `""`), `"name":`+g.pick(`"grep"`, `"read"`, `"grep"`, `""`),
			`"arguments":`+g.pick(`"{\"q\":1}"`, `"{}"`), g.rare(20, `"namespace":"ns"`))
	case 8, 9, 10:
		return g.obj(`"type":"function_call_output"`, `"call_id":`+g.pick(`"c1"`, `"c2"`), g.opt(10, `"output":`+g.either(g.str, parts)))
	}
	return g.obj(`"type":`+g.pick(`"reasoning"`, `"message"`, `"item_reference"`), `"summary":[]`)
}

// BenchmarkTokenizeBody is what a tokenized request costs the router before it asks /tokenize:
// its one parse and its query (one-parse), against the same parse followed by the encoding/json
// decoding and conversion that wrote the query before (encoding-json), for the agent chat of
// BenchmarkParse sent as a chat, a Responses and a Messages body.
func BenchmarkTokenizeBody(b *testing.B) {
	for _, p := range []struct {
		name  string
		parse func(reqkey.Header, []byte) (*protocol.Request, error)
		as    func([]byte) []byte
		ref   func(body []byte) ([]byte, bool)
	}{
		{"chat", protocol.ParseChat, func(c []byte) []byte { return c },
			func(body []byte) ([]byte, bool) { return refTokenizeBody(body, "m", false) }},
		{"responses", protocol.ParseResponses, func(c []byte) []byte { r, _ := chatAs(c); return r },
			func(body []byte) ([]byte, bool) { return refConvertedBody(&responsesProtocol, body, "m") }},
		{"messages", protocol.ParseMessages, func(c []byte) []byte { _, m := chatAs(c); return m },
			func(body []byte) ([]byte, bool) { return refConvertedBody(&messagesProtocol, body, "m") }},
	} {
		for _, s := range benchSizes[:2] {
			body := p.as(agentChatBody(s.size))
			for _, way := range []string{"one-parse", "encoding-json"} {
				b.Run(p.name+"/"+s.name+"/"+way, func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(len(body)))
					for b.Loop() {
						r, err := p.parse(nil, body)
						if err != nil {
							b.Fatal(err)
						}
						var ok bool
						if way == "one-parse" {
							_, ok = r.AppendTokenizeBody(nil, body, "m")
						} else {
							_, ok = p.ref(body)
						}
						if !ok {
							b.Fatal("not rendered")
						}
					}
				})
			}
		}
	}
}
