// Package protocol reads the request bodies of the APIs the router serves, parsing each body
// exactly once: the model, whether it streams, the ids the routing keys are made of (package
// reqkey derives the session and hash keys from them and the headers), and the routing text (the
// history key of a conversation, the prompt of the others). Everything here is a pure function of
// the request's headers and body.
package protocol

import (
	"net/http"

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
	// MaxTokens is the most output tokens the request asks for (max_tokens,
	// max_completion_tokens or max_output_tokens), or 0 when it names none; rate limits count
	// it.
	MaxTokens int
}

// Error is a client error in the request body; its message is safe to show the client.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// Parse reads a request body and headers. A body that is not a JSON object, or whose routing
// fields have the wrong JSON type, is an *Error. Object keys are matched exactly, as vLLM does.
func Parse(h reqkey.Header, raw []byte) (*Request, error) {
	if h == nil {
		h = http.Header(nil)
	}
	var b body
	if err := parseBody(raw, &b); err != nil {
		return nil, err
	}
	r := &Request{Model: string(b.model), Stream: b.stream, Chat: b.messages != nil, MaxTokens: max(b.maxTokens, b.maxCompletionTokens)}
	if r.Chat {
		r.Text = historyKey(b.tools, b.messages, onePassLimit(raw))
	} else {
		r.Text = routingText(&b, onePassLimit(raw))
	}
	paramsID, sessionID, userID, user := string(b.paramsID), string(b.sessionID), string(b.userID), string(b.user)
	r.SessionKey = reqkey.SessionKey(h, paramsID, []string{sessionID}, []string{userID, user})
	r.HashKey = reqkey.HashKey(h, []string{paramsID, user, sessionID, userID}, r.Text)
	return r, nil
}
