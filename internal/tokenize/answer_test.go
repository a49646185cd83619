package tokenize

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// An engine's answer gives its tokens whatever else it holds and in whatever order; an answer
// that is not an object with one array of 32-bit tokens is refused.
func TestParseTokens_ReadsTheTokensAndRefusesWhatIsNotAnAnswer(t *testing.T) {
	good := []struct {
		answer string
		want   []uint32
	}{
		{`{"count":3,"max_model_len":8192,"tokens":[1,22,333],"token_strs":null}`, []uint32{1, 22, 333}},
		{` { "tokens" : [ 0 , 4294967295 ] , "extra": {"a":[1,{"b":"x\"y"}],"c":-1.5e3,"d":true} } `, []uint32{0, 4294967295}},
		{`{"tokens":[]}`, []uint32{}},
	}
	for _, c := range good {
		got, err := parseTokens([]byte(c.answer), 0)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.answer, got, err, c.want)
		}
	}
	for _, bad := range []string{
		``, `[]`, `{}`, `{"count":3}`, `{"tokens":[1,2}`, `{"tokens":[1,,2]}`, `{"tokens":[-1]}`,
		`{"tokens":[4294967296]}`, `{"tokens":[1.5]}`, `{"tokens":[01]}`, `{"tokens":"1,2"}`,
		`{"tokens":[1],"tokens":[2]}`, `{"tokens":[1]} x`, `{"tokens":[1],}`, `{"a":"unterminated}`,
		`{"tokens":[1],"a":` + string(bytes.Repeat([]byte("["), maxDepth+2)) + string(bytes.Repeat([]byte("]"), maxDepth+2)) + `}`,
	} {
		if got, err := parseTokens([]byte(bad), 0); err == nil {
			t.Errorf("%q read as %v, want an error", bad, got)
		}
	}
}

// The answer's reader agrees with encoding/json: whatever both read, they read alike, and an
// answer encoding/json reads as one tokens array the reader reads too.
func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(`{"count":3,"max_model_len":8192,"tokens":[1,22,333]}`))
	f.Add([]byte(`{"tokens":[0,4294967295],"x":{"y":[null,true,"z"]}}`))
	f.Add([]byte(`{"tokens":[1],"tokens":[2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseTokens(b, 4)
		var want struct {
			Tokens []uint32 `json:"tokens"`
		}
		jerr := json.Unmarshal(b, &want)
		if err == nil && jerr == nil && !slices.Equal(got, want.Tokens) {
			t.Fatalf("%q: read %v, encoding/json %v", b, got, want.Tokens)
		}
		plain := bytes.Count(b, []byte(`"tokens"`)) == 1 && !bytes.ContainsRune(b, '\\')
		if jerr == nil && want.Tokens != nil && plain && err != nil {
			t.Fatalf("%q: refused (%v), encoding/json read %v", b, err, want.Tokens)
		}
	})
}
