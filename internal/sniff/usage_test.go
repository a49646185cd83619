package sniff

import (
	"strings"
	"testing"
)

func TestUsageIsFoundInEveryAPIsAnswer(t *testing.T) {
	filler := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("token ", 3000) + "\"}}]}\n\n"
	for _, tc := range []struct {
		name, answer           string
		prompt, cached, output int
		ok, cachedKnown        bool
	}{
		{"chat json", `{"id":"c","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}}`, 100, 64, 5, true, true},
		{"chat json without details (vLLM by default)", `{"usage":{"prompt_tokens":7,"completion_tokens":1}}`, 7, 0, 1, true, false},
		{"chat stream, usage chunk after a long answer", filler + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":3000,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\ndata: [DONE]\n\n", 300, 256, 3000, true, true},
		{"chat stream without usage", filler + "data: [DONE]\n\n", 0, 0, 0, false, false},
		{"responses stream", "event: response.created\ndata: {\"response\":{\"id\":\"r\",\"usage\":null}}\n\n" +
			"event: response.completed\ndata: {\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":3}}}\n\n", 50, 32, 3, true, true},
		{"messages stream: input in message_start, only output at the end", "event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":80,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n" +
			filler + "event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n", 100, 80, 9, true, true},
	} {
		u := NewUsage()
		for chunk := range chunks(tc.answer, 333) { // in pieces, as reads deliver it
			u.Feed([]byte(chunk))
		}
		got := u.Result()
		u.Release()
		if want := (Tokens{tc.prompt, tc.cached, tc.output, tc.ok, tc.cachedKnown}); got != want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, want)
		}
	}
}

// chunks yields s in pieces of n bytes.
func chunks(s string, n int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

func TestReadingAUsageObjectAllocatesNothing(t *testing.T) {
	obj := []byte(`{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64},"x":[{"a":"b"}]}`)
	var got Tokens
	if n := testing.AllocsPerRun(100, func() { got, _ = readUsageAt(obj) }); n != 0 {
		t.Errorf("%v allocations per read, want 0", n)
	}
	if want := (Tokens{Prompt: 100, Cached: 64, Output: 5, OK: true, CachedKnown: true}); got != want {
		t.Errorf("read %+v, want %+v", got, want)
	}
}
