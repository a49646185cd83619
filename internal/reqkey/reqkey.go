// Package reqkey derives everything routing needs from one client request, parsing its JSON body
// exactly once: the model, whether it streams, the session key (exact session affinity), the hash
// key of the hash policies, and the routing text (the serialized chat history for chat requests,
// the prompt for the others). Everything here is a pure function of the request's headers and body.
package reqkey

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// Request is what routing knows about one request.
type Request struct {
	Model  string // the body's "model"; empty when absent
	Stream bool   // "stream": true
	// Chat says the body carries a conversation: a chat's "messages", a Responses request's
	// "input" or a Messages request's "messages". Only conversations have session affinity.
	Chat bool

	// SessionKey is "session:<id>" or "user:<id>" from the first non-blank source in SessionSources
	// order, or empty. Ids longer than MaxIDLen are replaced by a fixed-size hash.
	SessionKey string
	// HashKey is the key of the consistent_hash and rendezvous_hash policies: the first id in
	// HashKeyHeaders, then the body ids, else the routing text.
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

// MaxIDLen is the longest session id kept verbatim; longer ids are stored as a hash.
const MaxIDLen = 256

// Session id sources, in precedence order. Header names are matched case-insensitively.
var (
	// SessionHeaders carry a session-scoped id (after the body's session_params.session_id).
	SessionHeaders = []string{"x-session-id", "x-claude-code-session-id", "x-session-affinity", "session-id", "session_id"}
	// UserHeader carries a user-scoped id.
	UserHeader = "x-user-id"
	// HashKeyHeaders are read, in order, by the hash policies.
	HashKeyHeaders = []string{"x-session-id", "x-user-id", "x-tenant-id", "x-correlation-id", "x-request-id", "x-trace-id"}
)

// Header is what Parse reads of the request's headers: http.Header, or an adapter over another
// HTTP stack's headers. Get matches names case-insensitively and returns "" when absent.
type Header interface {
	Get(key string) string
}

// Error is a client error in the request body; its message is safe to show the client.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// id is a session or user id: a JSON string's value or a JSON number as written.
type id string

// Parse reads a request body and headers. A body that is not a JSON object, or whose routing
// fields have the wrong JSON type, is an *Error. Object keys are matched exactly, as vLLM does.
func Parse(h Header, raw []byte) (*Request, error) {
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
	paramsID, sessionID, userID, user := id(b.paramsID), id(b.sessionID), id(b.userID), id(b.user)
	r.SessionKey = sessionKey(h, paramsID, []id{sessionID}, []id{userID, user})
	r.HashKey = hashKey(h, []id{paramsID, user, sessionID, userID}, r.Text)
	return r, nil
}

// sessionKey applies the session precedence: first (the body's session_params.session_id), the
// session headers, the body's other session-scoped ids in order, then the user-scoped x-user-id
// header and the body's user-scoped ids in order.
func sessionKey(h Header, first id, sessions, users []id) string {
	if v := blankless(string(first)); v != "" {
		return namespaced("session:", v)
	}
	for _, name := range SessionHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return namespaced("session:", v)
		}
	}
	for _, v := range sessions {
		if v := blankless(string(v)); v != "" {
			return namespaced("session:", v)
		}
	}
	if v := blankless(h.Get(UserHeader)); v != "" {
		return namespaced("user:", v)
	}
	for _, v := range users {
		if v := blankless(string(v)); v != "" {
			return namespaced("user:", v)
		}
	}
	return ""
}

// hashKey is the first id in HashKeyHeaders, then the first of the body's ids, else text.
func hashKey(h Header, ids []id, text string) string {
	for _, name := range HashKeyHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return v
		}
	}
	for _, v := range ids {
		if s := blankless(string(v)); s != "" {
			return s
		}
	}
	return text
}

func blankless(s string) string { return strings.TrimSpace(s) }

func namespaced(kind, v string) string {
	if len(v) <= MaxIDLen {
		return kind + v
	}
	sum := sha256.Sum256([]byte(v))
	return kind + "sha256:" + hex.EncodeToString(sum[:16])
}

// BytesPerToken is the rough number of bytes of request text per prompt token, for the estimates
// made without a tokenizer: the token rate limit, the prefill an attempt weighs in the tokens
// load signal, and what a prefix match saves in cache_aware's cost mode.
const BytesPerToken = 4
