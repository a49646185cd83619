package protocol_test

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// agentProtocol is one of the agent protocols' readers and its reference.
type agentProtocol struct {
	name  string // as the export hooks name it
	parse func(reqkey.Header, []byte) (*protocol.Request, error)
	ref   func(http.Header, []byte) (*protocol.Request, error)
	// shapes says what a value under each key looks like in a request of the protocol: the
	// keys of the objects it may be, and which of them to draw from (see randomAgentDoc).
	top    []string
	main   []string // the keys of top the key is written from, drawn half the time
	shapes map[string]shape
}

// shape is what a generated value under some key is most of the time: an object with keys drawn
// from keys, an array of such objects, a string from strs, or any of these.
type shape struct {
	objectKeys []string // the value is an object with these keys
	arrayKeys  []string // the value is an array of objects with these keys
	strs       []string // the value is one of these strings
	// text says the value is a string of random text, array that it is an array of strings;
	// either may be combined with arrayKeys or objectKeys: then one of them is drawn.
	text bool
}

var (
	typedRoles = []string{`"user"`, `"assistant"`, `"system"`, `"developer"`, `"tool"`, `"u"`, `""`, `"us\u0065r"`}
	partKeys   = []string{"type", "text", "refusal", "image_url", "annotations", "cache_control"}
	partTypes  = []string{`"input_text"`, `"output_text"`, `"text"`, `"refusal"`, `"input_image"`, `"summary_text"`, `"reasoning_text"`, `""`, `"input_file"`, `"te\u0078t"`}
	blockKeys  = []string{"type", "text", "id", "tool_use_id", "name", "input", "content", "is_error", "thinking", "signature", "data", "cache_control", "source"}
	blockTypes = []string{`"text"`, `"image"`, `"document"`, `"tool_use"`, `"tool_result"`, `"thinking"`, `"redacted_thinking"`, `"server_tool_use"`, `""`, `"t\u0065xt"`}
	toolTypes  = []string{`"function"`, `"custom"`, `"web_search"`, `"mcp"`, `""`, `"bash_20250124"`, `"functio\u006e"`}
)

var responsesProtocol = agentProtocol{
	name:  "responses",
	parse: protocol.ParseResponses,
	ref:   refParseResponses,
	top: []string{"model", "stream", "store", "previous_response_id", "instructions", "input", "tools",
		"conversation", "prompt_cache_key", "user", "session_params", "metadata", "temperature"},
	main: []string{"input", "input", "tools", "instructions"},
	shapes: map[string]shape{
		"model":                {strs: []string{`"gpt"`, `"m"`}},
		"stream":               {strs: []string{"true", "false"}},
		"store":                {strs: []string{"true", "false"}},
		"previous_response_id": {strs: []string{`"resp_1"`, `"r\u0031"`}},
		"instructions":         {text: true},
		"input": {text: true, arrayKeys: []string{"type", "role", "content", "call_id", "name", "arguments",
			"output", "summary", "encrypted_content", "id", "status", "cache_control", "action"}},
		"type": {strs: []string{`"message"`, `"function_call"`, `"function_call_output"`, `"reasoning"`,
			`"item_reference"`, `"web_search_call"`, `""`, `"mess\u0061ge"`, `"function_call_outpu\u0074"`}},
		"role":              {strs: typedRoles},
		"content":           {text: true, arrayKeys: partKeys},
		"output":            {text: true, arrayKeys: partKeys},
		"summary":           {arrayKeys: partKeys},
		"call_id":           {text: true},
		"name":              {text: true},
		"text":              {text: true},
		"refusal":           {text: true},
		"encrypted_content": {text: true},
		"arguments":         {text: true, objectKeys: []string{"a", "b", "cache_control"}},
		"tools":             {arrayKeys: []string{"type", "name", "description", "parameters", "strict", "function", "cache_control", "server_label"}},
		"description":       {text: true},
		"function":          {objectKeys: []string{"name", "description", "parameters", "type"}},
		"parameters":        {objectKeys: []string{"type", "properties", "required", "cache_control"}},
		"conversation":      {text: true, objectKeys: []string{"id", "x"}},
		"session_params":    {objectKeys: []string{"session_id", "x"}},
		"id":                {text: true},
		"cache_control":     {objectKeys: []string{"type", "ttl"}},
	},
}

var messagesProtocol = agentProtocol{
	name:  "messages",
	parse: protocol.ParseMessages,
	ref:   refParseMessages,
	top:   []string{"model", "stream", "system", "messages", "tools", "metadata", "max_tokens", "user"},
	main:  []string{"messages", "messages", "tools", "system"},
	shapes: map[string]shape{
		"model":         {strs: []string{`"claude"`, `"m"`}},
		"stream":        {strs: []string{"true", "false"}},
		"system":        {text: true, arrayKeys: blockKeys},
		"messages":      {arrayKeys: []string{"role", "content", "cache_control", "x"}},
		"role":          {strs: typedRoles},
		"content":       {text: true, arrayKeys: blockKeys},
		"type":          {strs: blockTypes},
		"text":          {text: true},
		"thinking":      {text: true},
		"data":          {text: true},
		"id":            {text: true},
		"tool_use_id":   {text: true},
		"name":          {text: true},
		"signature":     {text: true},
		"input":         {objectKeys: []string{"cmd", "path", "cache_control"}},
		"is_error":      {strs: []string{"true", "false"}},
		"tools":         {arrayKeys: []string{"type", "name", "description", "input_schema", "cache_control", "max_uses"}},
		"description":   {text: true},
		"input_schema":  {objectKeys: []string{"type", "properties", "required"}},
		"metadata":      {objectKeys: []string{"user_id", "x"}},
		"cache_control": {objectKeys: []string{"type", "ttl"}},
		"source":        {objectKeys: []string{"type", "data"}},
	},
}

var agentProtocols = []*agentProtocol{&responsesProtocol, &messagesProtocol}

// randomAgentDoc builds a JSON object shaped like a request of p most of the time, and otherwise
// anything: fields repeated, null, of the wrong type, holding numbers no float64 holds, escapes,
// surrogates and invalid UTF-8.
func randomAgentDoc(r *rand.Rand, p *agentProtocol) []byte {
	strs := []string{`""`, `"a b"`, `"\u00e9\n"`, `"\ud83d\ude00"`, `"\ud83d"`, "\"\xff\xc3(\"", `"\"\\\/"`,
		`"{\"b\":1,\"a\":2}"`, `" s "`, "\"\u2028\xe2\x80\xa9\"", `"cache_control"`, `"c1:x."`,
		"\"\xffc.\"", `"\u00ff."`}
	nums := []string{"0", "-0", "7", "-1.5e3", "0.25", "1e400", "12345678901234567890", "1e20", "5e-324"}
	keys := []string{"x", "", "type", "text", "content", "name", "cache_control", "id", "role"}
	var value func(depth int, key string) string
	object := func(depth int, names []string) string { return randObject(r, 6, 5, keys, names, depth, value) }
	array := func(_ int, elem func() string) string { return randArray(r, elem) }
	text := func() string {
		if r.IntN(2) == 0 {
			return strs[r.IntN(len(strs))]
		}
		return `"` + randText(r, 3) + `"`
	}
	value = func(depth int, key string) string {
		if sh, ok := p.shapes[key]; ok && depth < 7 && r.IntN(12) > 0 {
			var forms []func() string
			if sh.objectKeys != nil {
				forms = append(forms, func() string { return object(depth, sh.objectKeys) })
			}
			if sh.arrayKeys != nil {
				forms = append(forms, func() string {
					return array(depth, func() string {
						if r.IntN(8) == 0 {
							return value(depth+1, "")
						}
						return object(depth+1, sh.arrayKeys)
					})
				})
			}
			if sh.strs != nil {
				forms = append(forms, func() string { return sh.strs[r.IntN(len(sh.strs))] })
			}
			if sh.text {
				forms = append(forms, text)
			}
			if key == "type" && r.IntN(2) == 0 {
				// Types of parts, blocks and tools as well as of items.
				all := append(append(append([]string{}, partTypes...), blockTypes...), toolTypes...)
				return all[r.IntN(len(all))]
			}
			return forms[r.IntN(len(forms))]()
		}
		return randAny(r, depth, text, nums,
			func() string { return array(depth, func() string { return value(depth+1, "") }) },
			func() string { return object(depth, keys) })
	}
	return randTop(r, p.top, p.main, value)
}

// sameAsReference fails unless the reader of p and its encoding/json reference agree on body:
// both reject it with the same type error, both reject it otherwise, or both derive the same
// Request.
func sameAsReference(t testing.TB, p *agentProtocol, h http.Header, body []byte) (*protocol.Request, error) {
	t.Helper()
	got, err := p.parse(h, body)
	want, refErr := p.ref(h, body)
	if m := referenceMismatch(got, err, want, refErr, sameTypeError); m != "" {
		t.Fatalf("%s body %s: %s", p.name, body, m)
	}
	return got, err
}

// sameTypeError counts two errors as the same when both are the same type error or neither is a
// type error: the agent readers' other errors need not match their references' word for word.
func sameTypeError(err, refErr error) bool {
	typeErr := strings.HasPrefix(err.Error(), typeErrorPrefix)
	return typeErr == strings.HasPrefix(refErr.Error(), typeErrorPrefix) && (!typeErr || err.Error() == refErr.Error())
}

// checkAgentBothWays fails unless the history key of the body of p is the same written in one pass
// and in two, and the one-pass writer stays within the bounds the lexer found.
func checkAgentBothWays(t testing.TB, p *agentProtocol, body []byte) {
	t.Helper()
	k, ok := protocol.AgentKeyBothWays(p.name, body)
	switch {
	case !ok:
	case k.OnePass != k.TwoPass:
		t.Fatalf("%s body %.300q: key written in one pass\n%.300q\nin two\n%.300q", p.name, body, k.OnePass, k.TwoPass)
	case k.Written > k.Bound:
		t.Fatalf("%s body %.300q: the key writer writes %d bytes, over the bound of %d", p.name, body, k.Written, k.Bound)
	case k.MembersOutgrown:
		t.Fatalf("%s body %.300q: a canonical value has more members than the lexer counted", p.name, body)
	case k.NamedOutgrown:
		t.Fatalf("%s body %.300q: more named tools than the lexer counted", p.name, body)
	case k.BufferOutgrown:
		t.Fatalf("%s body %.300q: the one-pass writer outgrew the buffer of the key's bound", p.name, body)
	}
}

// orShort is n, or a tenth of it under -short.
func orShort(n int) int {
	if testing.Short() {
		return n / 10
	}
	return n
}

// scaled is n, or a tenth of it under -short or the race detector, which slows these sequential
// checks tenfold and finds nothing more in them.
func scaled(n int) int {
	if testing.Short() || raceEnabled {
		return n / 10
	}
	return n
}

// forEachAgentProtocol runs f as a subtest for each of agentProtocols, with a random source seeded
// by seed and the protocol's place in the list: each protocol's cases are its own, and the same
// on every run.
func forEachAgentProtocol(t *testing.T, seed uint64, f func(t *testing.T, p *agentProtocol, r *rand.Rand)) {
	for i, p := range agentProtocols {
		t.Run(p.name, func(t *testing.T) { f(t, p, rand.New(rand.NewPCG(seed, uint64(i)))) })
	}
}

// The readers and their encoding/json references agree on many random bodies shaped like
// requests, and every key is the same written in one pass or two.
func TestParseAgentMatchesReferenceOnRandomBodies(t *testing.T) {
	forEachAgentProtocol(t, 11, func(t *testing.T, p *agentProtocol, r *rand.Rand) {
		n := scaled(100000)
		ok, keys, typeErrs := 0, 0, 0
		for range n {
			body := randomAgentDoc(r, p)
			got, err := sameAsReference(t, p, nil, body)
			checkAgentBothWays(t, p, body)
			switch {
			case err != nil:
				if strings.HasPrefix(err.Error(), typeErrorPrefix) {
					typeErrs++
				}
			case got.Text != "":
				keys++
				fallthrough
			default:
				ok++
			}
		}
		if ok < n/5 || keys < n/20 || typeErrs < n/50 {
			t.Fatalf("%d of %d bodies parsed, %d with a key, %d type errors: the generator is too narrow", ok, n, keys, typeErrs)
		}
		t.Logf("%d of %d bodies parsed, %d with a key, %d type errors", ok, n, keys, typeErrs)
	})
}
