package sniff

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decodeByDecoder is how lastUsage read each usage object before objectAt: a decoder over the
// rest of the data.
func decodeByDecoder(data []byte) (u UsageObject, ok bool) {
	return u, json.NewDecoder(bytes.NewReader(data)).Decode(&u) == nil
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
