package protocol_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// The /tokenize queries of chat and completion bodies are checked against the encoding/json
// reference below: what the router asked before the query was rendered from the body's one parse
// (the body decoded again into the structs below, and the query encoded from them).

// refCacheSalt is the cache_salt of the body, as encoding/json decodes it.
func refCacheSalt(body []byte) (salt string, ok bool) {
	if !bytes.Contains(body, []byte(`"cache_salt"`)) {
		return "", true
	}
	var b struct {
		CacheSalt *string `json:"cache_salt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false
	}
	if b.CacheSalt == nil {
		return "", true
	}
	return *b.CacheSalt, true
}

// refTokenizeBody is the /tokenize query of a chat (completion false) or completion body.
func refTokenizeBody(body []byte, model string, completion bool) ([]byte, bool) {
	var ask bytes.Buffer
	enc := json.NewEncoder(&ask)
	enc.SetEscapeHTML(false)
	if completion {
		var c struct {
			Prompt           json.RawMessage `json:"prompt"`
			AddSpecialTokens *bool           `json:"add_special_tokens"`
		}
		var prompt string
		if json.Unmarshal(body, &c) != nil || json.Unmarshal(c.Prompt, &prompt) != nil {
			return nil, false
		}
		err := enc.Encode(struct {
			Model            string `json:"model"`
			Prompt           string `json:"prompt"`
			AddSpecialTokens *bool  `json:"add_special_tokens,omitempty"`
		}{model, prompt, c.AddSpecialTokens})
		return ask.Bytes(), err == nil
	}
	var chat struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools,omitempty"`
	}
	if json.Unmarshal(body, &chat) != nil {
		return nil, false
	}
	err := enc.Encode(struct {
		Model               string          `json:"model"`
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools,omitempty"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
	}{model, chat.Messages, chat.Tools, true})
	return ask.Bytes(), err == nil
}

// models are model names to ask with: one plain, one that encoding/json escapes.
var models = []string{"m", "org/m\u2028<é>\"\x01"}

// checkTokenizeBody checks the chat and completion queries and the cache salt of a body whose keys
// are spelled exactly against the reference.
func checkTokenizeBody(t testing.TB, body []byte) (asked int) {
	if !exactKeys(body) {
		return 0
	}
	if r, err := protocol.ParseChat(nil, body); err == nil {
		salt, ok := refCacheSalt(body)
		if got, gotOK := r.CacheSalt(body); got != salt || gotOK != ok {
			t.Fatalf("body %s: cache salt %q, %v; reference %q, %v", body, got, gotOK, salt, ok)
		}
	}
	for _, completion := range []bool{false, true} {
		parse := protocol.ParseChat
		if completion {
			parse = protocol.ParseCompletions
		}
		r, err := parse(nil, body)
		if err != nil {
			continue
		}
		for _, model := range models {
			got, ok := r.AppendTokenizeBody(nil, body, model)
			want, wantOK := refTokenizeBody(body, model, completion)
			if ok != wantOK || !bytes.Equal(got, want) {
				t.Fatalf("body %s (completion %v): query\n%s %v\nreference\n%s %v", body, completion, got, ok, want, wantOK)
			}
			if ok {
				asked++
			}
		}
	}
	return asked
}

// The chat and completion queries are those of the encoding/json reference on many random bodies
// shaped like requests.
func TestTokenizeBodyMatchesReferenceOnRandomBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	n := orShort(50000)
	asked := 0
	for range n {
		asked += checkTokenizeBody(t, randomDoc(r))
	}
	if asked < n/10 {
		t.Fatalf("only %d queries of %d bodies: the generator is too narrow", asked, n)
	}
}

// FuzzTokenizeBody: the queries of chat and completion bodies, and their cache salt, are those of
// the encoding/json reference.
func FuzzTokenizeBody(f *testing.F) {
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"a <b> & \u2028 \ud800"}],"tools":null}`,
		`{"messages" : [ {"role" : "user"} ] , "tools" : [ {"type":"function"} ], "messages":[]}`,
		`{"prompt":"once","add_special_tokens":false,"cache_salt":"s"}`,
		`{"prompt":null,"text":"t","add_special_tokens":"no"}`,
		`{"prompt":[1,2],"cache_salt":7}`,
		`{"model":"m"}`,
	} {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkTokenizeBody(t, body) })
}

func TestCacheSaltIsTheBodysTopLevelString(t *testing.T) {
	for _, c := range []struct {
		body, salt string
		ok         bool
	}{
		{`{"messages":[]}`, "", true},
		{`{"messages":[],"cache_salt":"tenant-a"}`, "tenant-a", true},
		{`{"cache_salt":"t\u00e9"}`, "té", true},
		{`{"cache_salt":"a","cache_salt":null}`, "", true},
		{`{"messages":[{"role":"user","content":"set \"cache_salt\" to x"}]}`, "", true},
		{`{"tools":[{"function":{"parameters":{"properties":{"cache_salt":{"type":"string"}}}}}]}`, "", true},
		{`{"cache_salt":7}`, "", false},
		{`{"cache_salt":7,"cache_salt":"x"}`, "", false},
	} {
		r, err := protocol.ParseChat(nil, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if salt, ok := r.CacheSalt([]byte(c.body)); salt != c.salt || ok != c.ok {
			t.Errorf("%s: salt %q, %v; want %q, %v", c.body, salt, ok, c.salt, c.ok)
		}
	}
}

// A completion is asked with its prompt when it is one string, with its own add_special_tokens;
// a batch of prompts, or prompts of token ids, is not asked, nor is a request of a route that is
// not tokenized.
func TestCompletionIsAskedWithItsOnePromptString(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"prompt":"once upon <a> time"}`, `{"model":"m","prompt":"once upon <a> time"}`},
		{`{"prompt":"once","add_special_tokens":false}`, `{"model":"m","prompt":"once","add_special_tokens":false}`},
		{`{"prompt" : "x\u00e9\n" , "add_special_tokens" : true}`, `{"model":"m","prompt":"xé\n","add_special_tokens":true}`},
		{`{"prompt":"once","add_special_tokens":"yes"}`, ``},
		{`{"prompt":["one","two"]}`, ``},
		{`{"prompt":[1,2,3]}`, ``},
		{`{"model":"m"}`, ``},
	} {
		r, err := protocol.ParseCompletions(nil, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		got, ok := r.AppendTokenizeBody(nil, []byte(c.body), "m")
		if want := c.want + "\n"; ok != (c.want != "") || ok && string(got) != want {
			t.Errorf("%s: %q, %v; want %q", c.body, got, ok, c.want)
		}
		if g, err := protocol.ParseGenerate(nil, []byte(c.body)); err != nil || g.Tokenizes() {
			t.Errorf("%s: a /generate request is tokenized (%v)", c.body, err)
		}
	}
}

// A chat is asked with its messages and tools as the client sent them, compacted.
func TestChatIsAskedWithItsMessagesAndToolsAsSent(t *testing.T) {
	body := `{ "tools" : [ {"type": "function", "function": {"name": "f <x>"}} ],
		"messages" : [ {"role": "user", "content": "hi \u00e9 </b>"} ], "model": "other" }`
	r, err := protocol.ParseChat(nil, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := r.AppendTokenizeBody(nil, []byte(body), "m")
	want := `{"model":"m","messages":[{"role":"user","content":"hi \u00e9 </b>"}],"tools":[{"type":"function","function":{"name":"f <x>"}}],"add_generation_prompt":true}` + "\n"
	if !ok || string(got) != want {
		t.Errorf("query %s, want %s", got, want)
	}
}
