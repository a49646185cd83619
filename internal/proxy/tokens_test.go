package proxy

import "testing"

// The salt is the body's top-level cache_salt only: the name in a message's text (its quotes
// escaped) or in a nested object is no salt, and a salt that is not a string gets no tokens.
func TestCacheSaltIsTheBodysTopLevelString(t *testing.T) {
	for _, c := range []struct {
		body, salt string
		ok         bool
	}{
		{`{"messages":[]}`, "", true},
		{`{"messages":[],"cache_salt":"tenant-a"}`, "tenant-a", true},
		{`{"cache_salt":"t\u00e9"}`, "té", true},
		{`{"messages":[{"role":"user","content":"set \"cache_salt\" to x"}]}`, "", true},
		{`{"tools":[{"function":{"parameters":{"properties":{"cache_salt":{"type":"string"}}}}}]}`, "", true},
		{`{"cache_salt":7}`, "", false},
		{`{"cache_salt":"x"`, "", false},
	} {
		salt, ok := cacheSalt([]byte(c.body))
		if salt != c.salt || ok != c.ok {
			t.Errorf("%s: salt %q, %v; want %q, %v", c.body, salt, ok, c.salt, c.ok)
		}
	}
}

// A completion is asked with its prompt when it is one string, with its own add_special_tokens;
// a batch of prompts, or prompts of token ids, is not asked.
func TestCompletionTokenAskTakesOnePromptString(t *testing.T) {
	for _, c := range []struct {
		body    string
		ok      bool
		special string
	}{
		{`{"prompt":"once upon a time"}`, true, "<nil>"},
		{`{"prompt":"once","add_special_tokens":false}`, true, "false"},
		{`{"prompt":["one","two"]}`, false, ""},
		{`{"prompt":[1,2,3]}`, false, ""},
		{`{"model":"m"}`, false, ""},
		{`{"prompt":`, false, ""},
	} {
		q, ok := completionTokenAsk([]byte(c.body))
		if ok != c.ok {
			t.Errorf("%s: ok %v, want %v", c.body, ok, c.ok)
			continue
		}
		if !ok {
			continue
		}
		special := "<nil>"
		if q.AddSpecialTokens != nil {
			special = map[bool]string{true: "true", false: "false"}[*q.AddSpecialTokens]
		}
		if q.Prompt == nil || q.Messages != nil || special != c.special {
			t.Errorf("%s: query %+v (add_special_tokens %s)", c.body, q, special)
		}
	}
}
