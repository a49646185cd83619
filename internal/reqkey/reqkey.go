// Package reqkey derives everything routing needs from one client request, parsing its JSON body
// exactly once: the model, whether it streams, the session key (exact session affinity), the hash
// key of the hash policies, and the routing text (the serialized chat history for chat requests,
// the prompt for the others). Everything here is a pure function of the request's headers and body.
package reqkey

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Request is what routing knows about one request.
type Request struct {
	Model  string // the body's "model"; empty when absent
	Stream bool   // "stream": true
	Chat   bool   // the body carries "messages"

	// SessionKey is "session:<id>" or "user:<id>" from the first non-blank source in SessionSources
	// order, or empty. Ids longer than MaxIDLen are replaced by a fixed-size hash.
	SessionKey string
	// HashKey is the key of the consistent_hash and rendezvous_hash policies: the first id in
	// HashKeyHeaders, then the body ids, else the routing text.
	HashKey string
	// Text is the history key of a chat request (see HistoryKey) or the routing text of a
	// completion or generate request. Empty when the request has nothing to match on.
	Text string
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

// Error is a client error in the request body; its message is safe to show the client.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// body holds the top-level fields routing reads. Free-form values are decoded into `any`, which
// reads a string content in the same single pass as a typed string field would.
type body struct {
	Model         *string         `json:"model"`
	Stream        *bool           `json:"stream"`
	Messages      []message       `json:"messages"`
	Tools         []tool          `json:"tools"`
	Prompt        any             `json:"prompt"`
	Text          any             `json:"text"`
	InputIDs      any             `json:"input_ids"`
	SessionParams json.RawMessage `json:"session_params"`
	SessionID     id              `json:"session_id"`
	UserID        id              `json:"user_id"`
	User          id              `json:"user"`
}

type message struct {
	Role       string     `json:"role"`
	Name       string     `json:"name"`
	Content    any        `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls"`
	ToolCallID string     `json:"tool_call_id"`
}

type toolCall struct {
	Function struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"`
	} `json:"function"`
}

type tool struct {
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  any    `json:"parameters"`
	} `json:"function"`
}

// id is a session or user id given as a JSON string or number; other types are no id.
type id string

func (v *id) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*v = id(s)
	case len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')):
		*v = id(b)
	}
	return nil
}

// Parse reads a request body and headers. A body that is not a JSON object, or whose routing
// fields have the wrong JSON type, is an *Error.
func Parse(h http.Header, raw []byte) (*Request, error) {
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, &Error{"request body is empty; expected a JSON object"}
	}
	if trimmed[0] != '{' {
		return nil, &Error{"request body must be a JSON object"}
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, &Error{"invalid JSON body: " + describe(err)}
	}
	r := &Request{Chat: b.Messages != nil}
	if b.Model != nil {
		r.Model = *b.Model
	}
	if b.Stream != nil {
		r.Stream = *b.Stream
	}
	var paramsID id
	if len(b.SessionParams) > 0 && b.SessionParams[0] == '{' {
		var sp struct {
			SessionID id `json:"session_id"`
		}
		if err := json.Unmarshal(b.SessionParams, &sp); err != nil {
			return nil, &Error{"invalid session_params: " + describe(err)}
		}
		paramsID = sp.SessionID
	}
	if r.Chat {
		r.Text = historyKey(b.Tools, b.Messages)
	} else {
		r.Text = routingText(&b)
	}
	r.SessionKey = sessionKey(h, paramsID, b.SessionID, b.UserID, b.User)
	r.HashKey = hashKey(h, paramsID, b.SessionID, b.UserID, b.User, r.Text)
	return r, nil
}

func describe(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q must not be a JSON %s", te.Field, te.Value)
	}
	return err.Error()
}

// sessionKey applies the session precedence: body session_params.session_id, the session headers,
// body session_id, then the user-scoped x-user-id header, body user_id and user.
func sessionKey(h http.Header, paramsID, sessionID, userID, user id) string {
	if v := blankless(string(paramsID)); v != "" {
		return namespaced("session:", v)
	}
	for _, name := range SessionHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return namespaced("session:", v)
		}
	}
	if v := blankless(string(sessionID)); v != "" {
		return namespaced("session:", v)
	}
	for _, v := range []string{h.Get(UserHeader), string(userID), string(user)} {
		if v = blankless(v); v != "" {
			return namespaced("user:", v)
		}
	}
	return ""
}

func hashKey(h http.Header, paramsID, sessionID, userID, user id, text string) string {
	for _, name := range HashKeyHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return v
		}
	}
	for _, v := range []id{paramsID, user, sessionID, userID} {
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

// routingText is what non-chat requests are matched on: /generate's text, prompt or input_ids, or
// the completion prompt (strings joined by newlines, token ids rendered as their decimal values).
func routingText(b *body) string {
	for _, v := range []any{b.Text, b.Prompt, b.InputIDs} {
		if v == nil {
			continue
		}
		var sb strings.Builder
		renderPrompt(&sb, v)
		if sb.Len() > 0 {
			return sb.String()
		}
	}
	return ""
}

func renderPrompt(sb *strings.Builder, v any) {
	switch p := v.(type) {
	case string:
		sb.WriteString(p)
	case float64:
		sb.WriteString(strconv.FormatFloat(p, 'f', -1, 64))
	case []any:
		for i, e := range p {
			if i > 0 {
				if _, num := e.(float64); num {
					sb.WriteByte(' ')
				} else {
					sb.WriteByte('\n')
				}
			}
			renderPrompt(sb, e)
		}
	}
}
