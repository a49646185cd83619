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
