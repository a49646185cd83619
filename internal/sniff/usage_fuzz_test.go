package sniff

import (
	"bytes"
	"encoding/json"
	"testing"
)

// lastUsageByDecoder is lastUsage as it read each usage object before objectAt: a decoder over
// the rest of the data.
func lastUsageByDecoder(data []byte) Tokens {
	key := []byte(`"usage"`)
	output, last := 0, true
	for end := len(data); ; {
		i := bytes.LastIndex(data[:end], key)
		if i < 0 {
			return Tokens{Output: output}
		}
		end = i
		rest := bytes.TrimLeft(data[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		var u UsageObject
		if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u) != nil {
			continue
		}
		r := u.Tokens()
		if last {
			output, last = r.Output, false
		}
		if r.OK {
			r.Output = max(r.Output, output)
			return r
		}
	}
}

// A worker's answer is read for its usage as a decoder over the whole rest of the answer read it,
// for answers whose usage objects are JSON objects.
func FuzzLastUsage(f *testing.F) {
	f.Add([]byte(`{"id":"c","usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`))
	f.Add([]byte("data: {\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}\n\ndata: {\"usage\":{\"output_tokens\":9}}\n\n"))
	f.Add([]byte(`{"usage": {"prompt_tokens": 1, "note": "a } in \"text\""}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, want := lastUsage(data), lastUsageByDecoder(data)
		if got != want && json.Valid(data) {
			t.Fatalf("%q: read %+v, a decoder read %+v", data, got, want)
		}
	})
}
