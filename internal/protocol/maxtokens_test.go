package protocol_test

import (
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// The output tokens a request asks for, which the rate limits add to the prompt estimate.
func TestMaxTokensAreReadForTheRateLimitsOfEveryProtocol(t *testing.T) {
	parsers := map[string]func(reqkey.Header, []byte) (*protocol.Request, error){
		"chat": protocol.ParseChat, "responses": protocol.ParseResponses, "messages": protocol.ParseMessages,
	}
	for _, tc := range []struct {
		parser, body string
		want         int
	}{
		{"chat", `{"messages":[],"max_tokens":256}`, 256},
		{"chat", `{"messages":[],"max_completion_tokens":512,"max_tokens":100}`, 512},
		{"chat", `{"prompt":"p","max_tokens":7.9}`, 7},
		{"chat", `{"prompt":"p","max_tokens":-3}`, 0},
		{"chat", `{"prompt":"p","max_tokens":"lots"}`, 0}, // passed over: the worker judges it
		{"chat", `{"prompt":"p","max_tokens":1e300}`, 1 << 30},
		{"chat", `{"prompt":"p","max_tokens":9,"max_tokens":3}`, 3}, // the last one given
		{"responses", `{"input":"hi","max_output_tokens":64}`, 64},
		{"responses", `{"input":"hi","max_tokens":64}`, 0}, // not the Responses API's name
		{"messages", `{"messages":[],"max_tokens":1024}`, 1024},
		{"messages", `{"messages":[],"max_tokens":null}`, 0},
	} {
		r, err := parsers[tc.parser](nil, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s %s: %v", tc.parser, tc.body, err)
		}
		if r.MaxTokens != tc.want {
			t.Errorf("%s %s: MaxTokens %d, want %d", tc.parser, tc.body, r.MaxTokens, tc.want)
		}
	}
}
