package sniff

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decodeByDecoder is how lastUsage read each usage object before objectAt and readUsageAt: a
// decoder over the rest of the data, into a UsageObject.
func decodeByDecoder(data []byte) (Tokens, bool) {
	var u UsageObject
	if json.NewDecoder(bytes.NewReader(data)).Decode(&u) != nil {
		return Tokens{}, false
	}
	return u.Tokens(), true
}

// A worker's answer is read for its usage as a decoder over the whole rest of the answer read it,
// for answers whose usage objects are JSON objects.
func FuzzLastUsage(f *testing.F) {
	f.Add([]byte(`{"id":"c","usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`))
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}\n\ndata: {\"usage\":{\"output_tokens\":9}}\n\n"))
	f.Add([]byte(`{"usage": {"prompt_tokens": 1, "note": "a } in \"text\""}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, want := lastUsage(data), lastUsageBy(data, decodeByDecoder)
		if got != want && json.Valid(data) {
			t.Fatalf("%q: read %+v, a decoder read %+v", data, got, want)
		}
	})
}

// A usage object is read by hand as encoding/json decodes it into a UsageObject: the same counts,
// and a failure exactly where decoding fails.
func FuzzReadUsageAsEncodingJSONDecodes(f *testing.F) {
	for _, s := range []string{
		`{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}`,
		`{"input_tokens":20,"cache_read_input_tokens":80,"cache_creation_input_tokens":null,"output_tokens":1}`,
		`{"input_tokens":50,"input_tokens_details":{"cached_tokens":32,"x":[1,{"y":"}"}]},"output_tokens":3}`,
		`{"Prompt_Tokens":1,"prompt_tokens":2,"PROMPT_TOKENS_DETAILS":{"cached_tokens":1},"prompt_tokens_details":{}}`,
		`{"prompt\u005ftokens":7,"completion_tokens":1.5}`,
		`{"prompt_tokens":-0,"prompt_tokens_details":null,"completion_tokens":"4"}`,
		`{"prompt_tokens":99999999999999999999}`,
		`{ "input_tokens" : 1e3 , "output_tokens" : true }`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		obj, ok := objectAt(data)
		if !ok || !json.Valid(obj) {
			return
		}
		var u UsageObject
		wantOK := json.Unmarshal(obj, &u) == nil
		var want Tokens
		if wantOK {
			want = u.Tokens()
		}
		got, gotOK := readUsageAt(obj)
		if got != want || gotOK != wantOK {
			t.Fatalf("%s: read %+v (%v), encoding/json %+v (%v)", obj, got, gotOK, want, wantOK)
		}
	})
}
