package router

import (
	"net/http"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// A routed request's body is parsed once, by its protocol's reader: the policy's keys, the
// cache salt and the /tokenize query (a chat's messages and tools, a completion's prompt, the chat
// a Responses or Messages body converts to, a tool_use input as Python writes it) all come from
// that one parse. (Two workers: a request with one candidate is not tokenized.)
func TestARoutedBodyIsParsedOnceEvenWhenItIsTokenized(t *testing.T) {
	tr := startEventRouter(t, testConfig(), eventWorkers(t, 2))
	bodies := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"cache_salt":"tenant-a","messages":[{"role":"user","content":"` + agentPrompt("chat") + `"}],` +
			`"tools":[{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}]}`},
		{"/v1/completions", `{"model":"sim-model","max_tokens":2,"prompt":"` + agentPrompt("completion") + `","add_special_tokens":true}`},
		{"/v1/responses", `{"model":"sim-model","max_output_tokens":2,"store":false,"instructions":"Be brief.",` +
			`"tools":[{"type":"function","name":"grep","parameters":{"type":"object"}}],"input":[{"role":"user","content":"` + agentPrompt("responses") + `"},` +
			`{"type":"function_call","call_id":"c1","name":"grep","arguments":"{\"q\":\"x\"}"},{"type":"function_call_output","call_id":"c1","output":"found"}]}`},
		{"/v1/messages", `{"model":"sim-model","max_tokens":2,"system":[{"type":"text","text":"Be brief."}],` +
			`"tools":[{"name":"grep","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"` + agentPrompt("messages") + `"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"grep","input":{"q":"é","n":1.0}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"found"}]}]}`},
	}
	for _, b := range bodies {
		parses, asked := protocol.Parses(), tokenizeCount(t, tr)
		resp := tr.post(t, b.path, b.body)
		if raw := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", b.path, resp.StatusCode, raw)
		}
		if got := tokenizeCount(t, tr) - asked; got != 1 {
			t.Fatalf("%s: /tokenize asked %v times, want once", b.path, got)
		}
		if got := protocol.Parses() - parses; got != 1 {
			t.Errorf("%s: the body was parsed %d times, want once", b.path, got)
		}
	}
}
