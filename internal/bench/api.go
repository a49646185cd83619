package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// APIs: how the runner sends each turn of a workload. The workload is the same for all of them;
// only the request's shape, its path and the stream's events differ.
const (
	APIChat           = "chat"            // POST /v1/chat/completions, the whole conversation every turn
	APIResponses      = "responses"       // POST /v1/responses, the whole conversation every turn
	APIResponsesChain = "responses-chain" // POST /v1/responses, previous_response_id and this turn's input
	APIMessages       = "messages"        // POST /v1/messages (Anthropic), the whole conversation every turn
)

// APIs lists the accepted values of --api.
var APIs = []string{APIChat, APIResponses, APIResponsesChain, APIMessages}

// apiFor returns the sender of an API name; "" is chat.
func apiFor(name string) (api, error) {
	switch name {
	case APIChat, "":
		return chatAPI{}, nil
	case APIResponses:
		return responsesAPI{}, nil
	case APIResponsesChain:
		return responsesAPI{chain: true}, nil
	case APIMessages:
		return messagesAPI{}, nil
	}
	return nil, fmt.Errorf("--api %q: want one of %s", name, strings.Join(APIs, ", "))
}

// api is one wire protocol: the path, body and headers of a turn's request, and how its
// server-sent events are read. Implementations hold no state: one value serves every session.
type api interface {
	path() string
	// tools converts a session's tools, an array of chat function tools, to the API's shape once
	// per session.
	tools(chat json.RawMessage) (json.RawMessage, error)
	// chains reports whether a turn continues the session's previous response by its id
	// instead of resending the conversation.
	chains() bool
	body(x *exchange) any
	header(h http.Header, x *exchange)
	// event reads the data of one server-sent event into st.
	event(data []byte, st *stream) error
	// final names the event that ends a complete stream.
	final() string
}

// exchange is one turn, as the runner hands it to an API.
type exchange struct {
	model string
	// msgs is the request's whole conversation; msgs[fresh:] are this turn's own messages.
	msgs      []turnMessage
	fresh     int
	tools     json.RawMessage // in the API's shape
	maxTokens int
	ignoreEOS bool
	// previousID is the session's previous response id when the API chains; "" otherwise and on
	// a session's first turn.
	previousID string
	sessionID  string // "" when the run sends no session ids
	mode       string // the session id mode
}

// stream is what the events of one response leave.
type stream struct {
	content bool // a content-bearing event (text, reasoning or a tool call) has come
	// contentEvents counts the content-bearing events, so that the client can time the gaps
	// between them (inter-token latency).
	contentEvents int
	done          bool // the API's final event has come
	reply         strings.Builder
	// prompt counts every prompt token, cached ones included, in every API, so that
	// cached / prompt is the same hit rate whichever API served the request.
	prompt, cached, output int
	responseID             string
	calls                  []ToolCall // the reply's tool calls, in order
	// toolBlock maps an Anthropic content block's index to its call in calls; toolStart holds
	// each call's input as its content_block_start gave it.
	toolBlock map[int]int
	toolStart []string
	// in and cacheWrite are Anthropic's input_tokens and cache_creation_input_tokens, kept
	// because its events give the parts of the prompt one by one.
	in, cacheWrite int
}

// sawContent records a content-bearing event.
func (st *stream) sawContent() {
	st.content = true
	st.contentEvents++
}

// splitSystem returns the text of the conversation's leading system messages, joined by blank
// lines, and the number of them.
func splitSystem(msgs []turnMessage) (string, int) {
	n := 0
	for n < len(msgs) && msgs[n].Role == "system" {
		n++
	}
	parts := make([]string, n)
	for i := range n {
		parts[i] = msgs[i].Content
	}
	return strings.Join(parts, "\n\n"), n
}

// chatFunction is a function tool as the chat API gives it, the form workloads keep tools in.
type chatFunction struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

// convertTools maps every function tool of a chat tools array through conv; nil stays nil.
func convertTools[T any](chat json.RawMessage, conv func(*chatFunction) T) (json.RawMessage, error) {
	if len(chat) == 0 || string(chat) == "null" {
		return nil, nil
	}
	var in []chatFunction
	if err := json.Unmarshal(chat, &in); err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	out := make([]T, len(in))
	for i := range in {
		if in[i].Type != "function" || in[i].Function.Name == "" {
			return nil, fmt.Errorf("tools[%d]: only named function tools can be converted", i)
		}
		out[i] = conv(&in[i])
	}
	return json.Marshal(out)
}

// unquote decodes a JSON string, or returns "" for anything else.
func unquote(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}
