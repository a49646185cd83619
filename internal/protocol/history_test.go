package protocol_test

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// spelled is a key spelled out for a test: each "·" stands for the byte 0xFF that ends a field.
func spelled(s string) string { return strings.ReplaceAll(s, "·", "\xff") }

// historyOf returns the history key of a chat body given as its tools and messages JSON.
func historyOf(t testing.TB, tools, messages string) string {
	t.Helper()
	body := `{"model":"m","messages":` + messages
	if tools != "" {
		body += `,"tools":` + tools
	}
	body += "}"
	r, err := protocol.ParseChat(nil, []byte(body))
	if err != nil {
		t.Fatalf("Parse(%s): %v", body, err)
	}
	if !r.Chat {
		t.Fatalf("Parse(%s): not a chat", body)
	}
	return r.Text
}

const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}}}`
const searchTool = `{"type":"function","function":{"name":"search","description":"Search the web","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}`

// The key's framing, spelled out: each field is its text and the byte 0xFF behind a one-letter tag,
// each message ends with ".".
func TestHistoryKeyFraming(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"run","description":"Run it","parameters":{"b":1,"a":2}}},{"type":"function","function":{}}]`
	msgs := `[{"role":"system","content":"be brief"},
		{"role":"user","name":"ann","content":["hi",{"type":"text","text":" there"},{"type":"image_url","image_url":{"url":"u"}}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"run","arguments":"{\"x\":1}"}}]},
		{"role":"tool","tool_call_id":"1","content":"ok"},
		{"role":"critic","content":"fine"}]`
	want := spelled(`T···` + `Trun·Run it·{"a":2,"b":1}·` + `scbe brief·.` + `unann·chi·c there·.` + `afrun·{"x":1}·.` + `ti1·cok·.` + `rcritic·cfine·.`)
	if got := historyOf(t, tools, msgs); got != want {
		t.Errorf("key\n%q\nwant\n%q", got, want)
	}
}

func TestHistoryKeyToolsSortedByName(t *testing.T) {
	msgs := `[{"role":"user","content":"hi"}]`
	a := historyOf(t, "["+weatherTool+","+searchTool+"]", msgs)
	b := historyOf(t, "["+searchTool+","+weatherTool+"]", msgs)
	if a != b {
		t.Errorf("tool order changed the key:\n%q\n%q", a, b)
	}
	if !strings.HasPrefix(a, "T") {
		t.Errorf("key %q does not start with the tools", a)
	}
	if strings.Index(a, "get_weather") > strings.Index(a, "search") {
		t.Errorf("tools not sorted by name in %q", a)
	}
	if strings.Index(a, "search") > strings.Index(a, "hi") {
		t.Errorf("tools not before messages in %q", a)
	}
}

func TestHistoryKeyToolParametersAreCanonical(t *testing.T) {
	msgs := `[{"role":"user","content":"hi"}]`
	forms := []string{
		`[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"integer","minimum":0}},"required":["a"]}}}]`,
		`[{"function":{"parameters":{"required":["a"],"properties":{"b":{"minimum":0,"type":"integer"},"a":{"type":"string"}},"type":"object"},"description":"d","name":"f"},"type":"function"}]`,
		"[ {\"type\" : \"function\",\n \"function\": {\"name\":\"f\",\"description\":\"d\",\n\t\"parameters\": { \"properties\" : { \"b\" : {\"type\":\"integer\",\"minimum\":0.0}, \"a\":{\"type\":\"string\"} }, \"type\":\"object\", \"required\":[\"a\"] } } } ]",
	}
	want := historyOf(t, forms[0], msgs)
	for _, f := range forms[1:] {
		if got := historyOf(t, f, msgs); got != want {
			t.Errorf("equivalent schema gave another key:\n%q\nwant\n%q", got, want)
		}
	}
	// A real change of the schema changes the key.
	changed := strings.Replace(forms[0], `"required":["a"]`, `"required":["a","b"]`, 1)
	if historyOf(t, changed, msgs) == want {
		t.Error("a changed schema kept the key")
	}
	// Array order inside a schema is meaningful and kept.
	reordered := strings.Replace(forms[0], `"required":["a"]`, `"required":["b","a"]`, 1)
	ab := strings.Replace(forms[0], `"required":["a"]`, `"required":["a","b"]`, 1)
	if historyOf(t, reordered, msgs) == historyOf(t, ab, msgs) {
		t.Error("array order inside parameters ignored")
	}
}

func TestHistoryKeyTextlessChatIsEmpty(t *testing.T) {
	tests := []struct {
		name, messages string
	}{
		{"image only", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]`},
		{"image and audio", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]`},
		{"empty text part", `[{"role":"user","content":[{"type":"text","text":""},{"type":"image_url","image_url":{"url":"u"}}]}]`},
		{"empty string content", `[{"role":"user","content":""}]`},
		{"null content", `[{"role":"assistant","content":null}]`},
		{"no messages", `[]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := historyOf(t, "", tt.messages); got != "" {
				t.Errorf("key = %q, want empty", got)
			}
			r, _ := protocol.ParseChat(nil, []byte(`{"messages":`+tt.messages+`}`))
			if r.HashKey != "" {
				t.Errorf("HashKey = %q, want empty", r.HashKey)
			}
		})
	}
}

func TestHistoryKeyTextParts(t *testing.T) {
	str := historyOf(t, "", `[{"role":"user","content":"describe this"}]`)
	tests := []struct {
		name, messages string
	}{
		{"text part", `[{"role":"user","content":[{"type":"text","text":"describe this"}]}]`},
		{"text part beside an image", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"describe this"}]}]`},
		{"input_text part", `[{"role":"user","content":[{"type":"input_text","text":"describe this"}]}]`},
		{"bare string part", `[{"role":"user","content":["describe this"]}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := historyOf(t, "", tt.messages); got != str {
				t.Errorf("key %q, want the plain string's %q", got, str)
			}
		})
	}
	// Images contribute nothing, whatever their url.
	a := historyOf(t, "", `[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"a.png"}}]}]`)
	b := historyOf(t, "", `[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"b.png"}}]}]`)
	if a != b {
		t.Error("image url changed the key")
	}
}

func TestHistoryKeyCoversEveryField(t *testing.T) {
	base := `[{"role":"system","content":"be brief"},{"role":"user","content":"weather?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","name":"get_weather","content":"12C"}]`
	want := historyOf(t, "["+weatherTool+"]", base)
	variants := map[string][2]string{
		"role":          {"[" + weatherTool + "]", strings.Replace(base, `"role":"system"`, `"role":"developer"`, 1)},
		"content":       {"[" + weatherTool + "]", strings.Replace(base, `"be brief"`, `"be brisk"`, 1)},
		"call name":     {"[" + weatherTool + "]", strings.Replace(base, `"name":"get_weather","arguments"`, `"name":"get_time","arguments"`, 1)},
		"arguments":     {"[" + weatherTool + "]", strings.Replace(base, `Oslo`, `Rome`, 1)},
		"tool_call_id":  {"[" + weatherTool + "]", strings.Replace(base, `"tool_call_id":"c1"`, `"tool_call_id":"c2"`, 1)},
		"message name":  {"[" + weatherTool + "]", strings.Replace(base, `"name":"get_weather","content"`, `"name":"other","content"`, 1)},
		"tool desc":     {"[" + strings.Replace(weatherTool, "Weather for", "Weather in", 1) + "]", base},
		"tool name":     {"[" + strings.Replace(weatherTool, `"get_weather"`, `"weather"`, 1) + "]", base},
		"tool params":   {"[" + strings.Replace(weatherTool, `"city"]`, `"unit"]`, 1) + "]", base},
		"no tools":      {"", base},
		"extra tool":    {"[" + weatherTool + "," + searchTool + "]", base},
		"dropped reply": {"[" + weatherTool + "]", base[:strings.LastIndex(base, `,{"role":"tool"`)] + "]"},
	}
	for name, v := range variants {
		if got := historyOf(t, v[0], v[1]); got == want {
			t.Errorf("changing the %s kept the key", name)
		}
	}
	// Tool-call arguments as an object are rendered canonically.
	o1 := historyOf(t, "", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"b":1,"a":2}}}]}]`)
	o2 := historyOf(t, "", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":2,"b":1}}}]}]`)
	if o1 == "" || o1 != o2 {
		t.Errorf("object arguments not canonical: %q vs %q", o1, o2)
	}
}

// Moving text from one field to another, or splitting it differently, must change the key.
func TestHistoryKeyNoCollisionByMovingText(t *testing.T) {
	pairs := []struct {
		name         string
		tools1, msg1 string
		tools2, msg2 string
	}{
		{"role and content swapped", "", `[{"role":"user","content":"assistant"}]`, "", `[{"role":"assistant","content":"user"}]`},
		{"content split across parts", "", `[{"role":"user","content":"hello world"}]`, "", `[{"role":"user","content":[{"type":"text","text":"hello "},{"type":"text","text":"world"}]}]`},
		{"content split differently across parts", "", `[{"role":"user","content":["ab","c"]}]`, "", `[{"role":"user","content":["a","bc"]}]`},
		{"content split across messages", "", `[{"role":"user","content":"ab"}]`, "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`},
		{"text moved to the next message", "", `[{"role":"user","content":"ab"},{"role":"user","content":"c"}]`, "", `[{"role":"user","content":"a"},{"role":"user","content":"bc"}]`},
		{"name vs content", "", `[{"role":"user","name":"bob","content":"hi"}]`, "", `[{"role":"user","content":"bobhi"}]`},
		{"name vs content prefix", "", `[{"role":"user","name":"bob","content":"hi"}]`, "", `[{"role":"user","name":"bobhi"}]`},
		{"name moved into content", "", `[{"role":"user","name":"b","content":"x"}]`, "", `[{"role":"user","content":"bx"}]`},
		{"role prefix moved to name", "", `[{"role":"user","content":"x"}]`, "", `[{"role":"use","name":"r","content":"x"}]`},
		{"tool_call_id vs content", "", `[{"role":"tool","tool_call_id":"c1","content":"ok"}]`, "", `[{"role":"tool","content":"c1ok"}]`},
		{"tool_call_id vs name", "", `[{"role":"tool","tool_call_id":"c1","content":"ok"}]`, "", `[{"role":"tool","name":"c1","content":"ok"}]`},
		{"call name vs arguments", "", `[{"role":"assistant","tool_calls":[{"function":{"name":"ab","arguments":""}}]}]`, "", `[{"role":"assistant","tool_calls":[{"function":{"name":"a","arguments":"b"}}]}]`},
		{"call split in two", "", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"xy"}}]}]`, "", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"x"}},{"function":{"name":"","arguments":"y"}}]}]`},
		{"call vs content", "", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]`, "", `[{"role":"assistant","content":"f{}"}]`},
		{"delimiter forgery in content", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", `[{"role":"user","content":"a.m4:user0:0:c1:b"}]`},
		{"delimiter forgery without lengths", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", `[{"role":"user","content":"a.m4:user0:0:cb"}]`},
		{"compact delimiter forgery", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", `[{"role":"user","content":"a.uc1:b"}]`},
		{"compact delimiter forgery without lengths", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", `[{"role":"user","content":"a.ucb"}]`},
		// No text holds the byte that ends a field: U+00FF is two other bytes, a byte 0xFF of
		// invalid UTF-8 is U+FFFD.
		{"field end forgery with U+00FF", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", `[{"role":"user","content":"a\u00ff.ucb"}]`},
		{"field end forgery with a byte 0xFF", "", `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`, "", "[{\"role\":\"user\",\"content\":\"a\xff.ucb\"}]"},
		{"field end forgery in a name", "", `[{"role":"user","name":"a","content":"b"}]`, "", "[{\"role\":\"user\",\"name\":\"a\xffcb\"}]"},
		{"other role vs known role", "", `[{"role":"u","content":"x"}]`, "", `[{"role":"user","content":"x"}]`},
		{"name vs tool_call_id of one text", "", `[{"role":"tool","name":"x","content":"y"}]`, "", `[{"role":"tool","tool_call_id":"x","content":"y"}]`},
		{"length forgery in content", "", `[{"role":"user","content":"ab"}]`, "", `[{"role":"user","content":"a"},{"role":"user","content":"","name":"b"}]`},
		{"tool description vs system text", `[{"type":"function","function":{"name":"f","description":"be brief"}}]`, `[{"role":"user","content":"hi"}]`,
			`[{"type":"function","function":{"name":"f"}}]`, `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`},
		{"tool name vs description", `[{"type":"function","function":{"name":"fx","description":""}}]`, `[{"role":"user","content":"hi"}]`,
			`[{"type":"function","function":{"name":"f","description":"x"}}]`, `[{"role":"user","content":"hi"}]`},
		{"tool split in two", `[{"type":"function","function":{"name":"a","description":"bc"}}]`, `[]`,
			`[{"type":"function","function":{"name":"a","description":"b"}},{"type":"function","function":{"name":"c"}}]`, `[]`},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			k1, k2 := historyOf(t, p.tools1, p.msg1), historyOf(t, p.tools2, p.msg2)
			if k1 == k2 {
				t.Errorf("two conversations share the key %q", k1)
			}
		})
	}
}

// --- random conversations for the property tests ---

// pieces are short strings that look like the key's own delimiters, field ends and the length
// prefixes of an earlier framing, so random texts keep trying to forge field boundaries: U+00FF
// ("ÿ") and U+FFFD, which a byte 0xFF of invalid UTF-8 in a body stands for.
var pieces = []string{"a", "b", "1", "0", ":", "c", "m", "t", "f", ".", "1:", "0:", "user", "é", " ", "\n", "{}", `"`, ".m", "c1:", "m4:user0:0:", "m4:user0:0:c", "u", "s", "T", "n", "i", "r", ".u", "uc", "uc1:", "n1:", "i1:", "f1:", "T1:",
	"ÿ", "ÿ.", "ÿc", "\uFFFD", "\uFFFD.u"}

func randText(r *rand.Rand, maxPieces int) string {
	var sb strings.Builder
	for range r.IntN(maxPieces + 1) {
		sb.WriteString(pieces[r.IntN(len(pieces))])
	}
	return sb.String()
}

var roles = []string{"system", "developer", "user", "assistant", "tool"}

func randRole(r *rand.Rand) string {
	if r.IntN(10) == 0 {
		return randText(r, 2)
	}
	return roles[r.IntN(len(roles))]
}

// randContent returns a JSON-ready content value and its text parts (the non-empty texts the key
// should contain, in order).
func randContent(r *rand.Rand) (any, []string) {
	switch r.IntN(5) {
	case 0:
		return nil, nil
	case 1, 2:
		s := randText(r, 4)
		if s == "" {
			return s, nil
		}
		return s, []string{s}
	default:
		var parts []any
		var texts []string
		for range r.IntN(4) {
			switch r.IntN(4) {
			case 0:
				parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": randText(r, 3)}})
			case 1:
				s := randText(r, 3)
				parts = append(parts, s)
				if s != "" {
					texts = append(texts, s)
				}
			default:
				s := randText(r, 3)
				parts = append(parts, map[string]any{"type": "text", "text": s})
				if s != "" {
					texts = append(texts, s)
				}
			}
		}
		return parts, texts
	}
}

// convMessage is a generated message: its JSON form and its normalized meaning.
type convMessage struct {
	JSON map[string]any
	Norm string
}

func randMessage(r *rand.Rand) convMessage {
	m := map[string]any{"role": randRole(r)}
	content, texts := randContent(r)
	m["content"] = content
	var name, callID string
	if r.IntN(4) == 0 {
		name = randText(r, 2)
		m["name"] = name
	}
	if r.IntN(4) == 0 {
		callID = randText(r, 2)
		m["tool_call_id"] = callID
	}
	var calls [][2]string
	if r.IntN(4) == 0 {
		var tc []any
		for range 1 + r.IntN(2) {
			c := [2]string{randText(r, 2), randText(r, 3)}
			calls = append(calls, c)
			tc = append(tc, map[string]any{"id": "x", "type": "function", "function": map[string]any{"name": c[0], "arguments": c[1]}})
		}
		m["tool_calls"] = tc
	}
	norm, _ := json.Marshal([]any{m["role"], name, callID, texts, calls})
	return convMessage{JSON: m, Norm: string(norm)}
}

func randTools(r *rand.Rand) ([]any, string) {
	n := 0
	if r.IntN(3) == 0 {
		n = 1 + r.IntN(3)
	}
	type normTool struct{ Name, Desc, Params string }
	var tools []any
	var norm []normTool
	for range n {
		name, desc := randText(r, 2), randText(r, 2)
		params := map[string]any{}
		for range r.IntN(3) {
			params[randText(r, 2)] = randText(r, 2)
		}
		canon, _ := json.Marshal(params)
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": name, "description": desc, "parameters": params}})
		norm = append(norm, normTool{name, desc, string(canon)})
	}
	slices.SortStableFunc(norm, func(a, b normTool) int { return strings.Compare(a.Name, b.Name) })
	s, _ := json.Marshal(norm)
	return tools, string(s)
}

func chatBody(t testing.TB, tools []any, msgs []convMessage) []byte {
	t.Helper()
	ms := make([]any, len(msgs))
	for i, m := range msgs {
		ms[i] = m.JSON
	}
	body := map[string]any{"model": "m", "messages": ms}
	if tools != nil {
		body["tools"] = tools
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func keyOf(t testing.TB, body []byte) string {
	t.Helper()
	r, err := protocol.ParseChat(nil, body)
	if err != nil {
		t.Fatalf("Parse(%s): %v", body, err)
	}
	return r.Text
}

// For any conversation H and any continuation H' (H plus appended messages), key(H) is a byte
// prefix of key(H'), and a continuation with text is strictly longer.
func TestHistoryKeyPrefixProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const cases = 4000
	for i := range cases {
		tools, _ := randTools(r)
		var msgs []convMessage
		for range r.IntN(6) {
			msgs = append(msgs, randMessage(r))
		}
		k := keyOf(t, chatBody(t, tools, msgs))
		grown := slices.Clone(msgs)
		for range 1 + r.IntN(3) {
			grown = append(grown, randMessage(r))
		}
		k2 := keyOf(t, chatBody(t, tools, grown))
		if !strings.HasPrefix(k2, k) {
			t.Fatalf("case %d: key(H) is not a prefix of key(H')\nH  %s\nH' %s\nkey(H)  %q\nkey(H') %q",
				i, chatBody(t, tools, msgs), chatBody(t, tools, grown), k, k2)
		}
		if k2 != "" && len(k2) <= len(k) {
			t.Fatalf("case %d: appended messages added nothing to the key %q", i, k2)
		}
	}
}

// Conversations that mean different things never share a non-empty key.
func TestHistoryKeyNoCollisionsOverRandomConversations(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const cases = 6000
	seen := make(map[string]string, cases)
	for range cases {
		tools, toolsNorm := randTools(r)
		var msgs []convMessage
		norm := toolsNorm
		for range r.IntN(4) {
			m := randMessage(r)
			msgs = append(msgs, m)
			norm += "|" + m.Norm
		}
		k := keyOf(t, chatBody(t, tools, msgs))
		if k == "" {
			continue
		}
		if prev, ok := seen[k]; ok && prev != norm {
			t.Fatalf("two different conversations share the key %q:\n%s\n%s", k, prev, norm)
		}
		seen[k] = norm
	}
	if len(seen) < cases/4 {
		t.Fatalf("only %d distinct keys: the generator is too narrow to test anything", len(seen))
	}
}

func TestHistoryKeyGrowsTurnByTurn(t *testing.T) {
	msgs := []string{
		`{"role":"system","content":"You are a coding agent."}`,
		`{"role":"user","content":"fix the test"}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a_test.go\"}"}}]}`,
		`{"role":"tool","tool_call_id":"1","content":"package a"}`,
		`{"role":"assistant","content":"Done."}`,
	}
	tools := "[" + weatherTool + "," + searchTool + "]"
	prev := historyOf(t, tools, "[]")
	if prev == "" {
		t.Fatal("tools alone give an empty key")
	}
	for i := 1; i <= len(msgs); i++ {
		k := historyOf(t, tools, "["+strings.Join(msgs[:i], ",")+"]")
		if !strings.HasPrefix(k, prev) || len(k) <= len(prev) {
			t.Fatalf("turn %d: key %q does not extend %q", i, k, prev)
		}
		prev = k
	}
}

// An earlier turn's key whose last message closes with a field ends where TurnEnds says a turn
// of its continuation may end: a cache of answers by key finds it from the continuation's key.
func TestTurnEndsFindTheEarlierTurnsKey(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	found := 0
	for i := range 2000 {
		tools, _ := randTools(r)
		var msgs []convMessage
		for range 1 + r.IntN(5) {
			msgs = append(msgs, randMessage(r))
		}
		k := keyOf(t, chatBody(t, tools, msgs))
		grown := append(slices.Clone(msgs), randMessage(r), randMessage(r))
		k2 := keyOf(t, chatBody(t, tools, grown))
		if !strings.HasSuffix(k, "\xff.") || len(k2) == len(k) {
			continue
		}
		var ends []int
		protocol.TurnEnds(k2, func(n int) { ends = append(ends, n) })
		if !slices.Contains(ends, len(k)) {
			t.Fatalf("case %d: the earlier key ends at %d, not among the turn ends %v of %q", i, len(k), ends, k2)
		}
		if !slices.IsSorted(ends) || slices.Contains(ends, len(k2)) {
			t.Fatalf("case %d: turn ends %v not in order below the key's own length %d", i, ends, len(k2))
		}
		found++
	}
	if found < 500 {
		t.Fatalf("only %d of 2000 cases had an earlier key closed by a field", found)
	}
}
