// Package protocol is what the router knows of the APIs it serves: OpenAI chat (chat.go),
// completions and /generate (completions.go), the OpenAI Responses API (responses.go) and the
// Anthropic Messages API (messages.go). Each file owns its API's request shape, its reading, its
// history key and its /tokenize query, and the shapes the simulator and the bench share (its
// endpoint, the Messages content blocks, the chat tool).
//
// A request body is parsed once. An API's reader (ParseChat, ParseCompletions, ParseGenerate,
// ParseResponses, ParseMessages; ParseModel for the load-only routes) checks the whole body in
// one pass of the lexer and returns the one value the policies read, a Request. What the router
// takes from the body afterwards (the history key, and when the policy wants the prompt tokens
// the cache salt and the /tokenize query) is read from the checked body by a reader that trusts
// the lexer (validated.go), never parsed again. Parses counts the parses.
//
// The split with package reqkey: reqkey derives the routing keys that know no API, the session
// key and the hash policies' key, from the request's headers and the ids each reader here finds
// in its body and hands it in its API's precedence. The history key is each API's own: it follows
// the API's shape, in the framing all of them share (history.go), so that conversations match
// whichever API carries them. Everything here is a pure function of the request's headers and
// body. How to add an API: docs/protocols.md.
package protocol

import (
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// Request is what routing knows about one request.
type Request struct {
	Model  string // the body's "model"; empty when absent
	Stream bool   // "stream": true
	// Chat says the body carries a conversation: a chat's "messages", a Responses request's
	// "input" or a Messages request's "messages". Only conversations have session affinity.
	Chat bool

	// SessionKey is "session:<id>" or "user:<id>" from the first non-blank source, or empty
	// (see reqkey.SessionKey).
	SessionKey string
	// HashKey is the key of the consistent_hash and rendezvous_hash policies (see
	// reqkey.HashKey): the first id in the headers, then the body ids, else the routing text.
	HashKey string
	// Text is the history key of a chat request (see HistoryKey) or the routing text of a
	// completion or generate request. Empty when the request has nothing to match on.
	Text string

	// PreviousResponseID is a Responses request's previous_response_id, verbatim; "" otherwise.
	// Only the worker that produced that response can continue from it.
	PreviousResponseID string
	// NoStore is set when a Responses request asks its response not to be stored ("store":
	// false), so there is no response id worth remembering.
	NoStore bool
	// query is the request's /tokenize query (tokenize.go).
	query rendering
	// MaxTokens is the most output tokens the request asks for (max_tokens,
	// max_completion_tokens or max_output_tokens), or 0 when it names none; rate limits count
	// it.
	MaxTokens int
}

// Error is a client error in the request body; its message is safe to show the client.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// ParseModel reads only what load-only routes need of a JSON body: that it is a JSON object, its
// model and stream. It derives no session, hash or history key, so nothing is learned from it.
// The values of the other members are checked to be well-formed JSON, and nothing else.
func ParseModel(_ reqkey.Header, raw []byte) (*Request, error) {
	var model []byte
	var stream bool
	err := parseObject(raw, func(s *scanner, key []byte) {
		switch string(key) {
		case "model":
			s.nullableString("model", &model)
		case "stream":
			stream = s.boolean("stream", false)
		default:
			s.skip(false)
		}
	})
	if err != nil {
		return nil, err
	}
	return &Request{Model: string(model), Stream: stream}, nil
}
