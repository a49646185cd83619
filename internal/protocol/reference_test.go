package protocol_test

// This file keeps the encoding/json implementation of Parse that the hand-written scanner replaced,
// unchanged except for names, as the reference of the differential fuzz target: for every valid
// body whose keys are spelled exactly, both must derive the same Request.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// refBody holds the top-level fields routing reads. Free-form values are decoded into `any`, which
// reads a string content in the same single pass as a typed string field would.
type refBody struct {
	Model         *string         `json:"model"`
	Stream        *bool           `json:"stream"`
	Messages      []refMessage    `json:"messages"`
	Tools         []refTool       `json:"tools"`
	Prompt        any             `json:"prompt"`
	Text          any             `json:"text"`
	InputIDs      any             `json:"input_ids"`
	SessionParams json.RawMessage `json:"session_params"`
	MaxTokens     json.RawMessage `json:"max_tokens"`
	MaxCompletion json.RawMessage `json:"max_completion_tokens"`
	SessionID     refId           `json:"session_id"`
	UserID        refId           `json:"user_id"`
	User          refId           `json:"user"`
}

type refMessage struct {
	Role       string        `json:"role"`
	Name       string        `json:"name"`
	Content    any           `json:"content"`
	ToolCalls  []refToolCall `json:"tool_calls"`
	ToolCallID string        `json:"tool_call_id"`
}

type refToolCall struct {
	Function struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"`
	} `json:"function"`
}

type refTool struct {
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  any    `json:"parameters"`
	} `json:"function"`
}

// refId is a session or user id given as a JSON string or number; other types are no id.
type refId string

func (v *refId) UnmarshalJSON(b []byte) error {
	switch {
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*v = refId(s)
	case len(b) > 0 && (b[0] == '-' || (b[0] >= '0' && b[0] <= '9')):
		*v = refId(b)
	}
	return nil
}

// refParse reads a request body and headers. A body that is not a JSON object, or whose routing
// fields have the wrong JSON type, is an *Error.
func refParse(h http.Header, raw []byte) (*protocol.Request, error) {
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, &protocol.Error{Msg: "request body is empty; expected a JSON object"}
	}
	if trimmed[0] != '{' {
		return nil, &protocol.Error{Msg: "request body must be a JSON object"}
	}
	var b refBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, &protocol.Error{Msg: "invalid JSON body: " + refDescribe(err)}
	}
	r := &protocol.Request{Chat: b.Messages != nil, MaxTokens: max(refTokenCount(b.MaxTokens), refTokenCount(b.MaxCompletion))}
	if b.Model != nil {
		r.Model = *b.Model
	}
	if b.Stream != nil {
		r.Stream = *b.Stream
	}
	var paramsID refId
	if len(b.SessionParams) > 0 && b.SessionParams[0] == '{' {
		var sp struct {
			SessionID refId `json:"session_id"`
		}
		if err := json.Unmarshal(b.SessionParams, &sp); err != nil {
			return nil, &protocol.Error{Msg: "invalid session_params: " + refDescribe(err)}
		}
		paramsID = sp.SessionID
	}
	if r.Chat {
		r.Text = refHistoryKey(b.Tools, b.Messages)
	} else {
		r.Text = refRoutingText(&b)
	}
	r.SessionKey = refSessionKey(h, paramsID, b.SessionID, b.UserID, b.User)
	r.HashKey = refHashKey(h, paramsID, b.SessionID, b.UserID, b.User, r.Text)
	return r, nil
}

func refDescribe(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q must not be a JSON %s", te.Field, te.Value)
	}
	return err.Error()
}

// refSessionKey applies the session precedence: body session_params.session_id, the session headers,
// body session_id, then the user-scoped x-user-id header, body user_id and user.
func refSessionKey(h http.Header, paramsID, sessionID, userID, user refId) string {
	if v := refBlankless(string(paramsID)); v != "" {
		return refNamespaced("session:", v)
	}
	for _, name := range reqkey.SessionHeaders {
		if v := refBlankless(h.Get(name)); v != "" {
			return refNamespaced("session:", v)
		}
	}
	if v := refBlankless(string(sessionID)); v != "" {
		return refNamespaced("session:", v)
	}
	for _, v := range []string{h.Get(reqkey.UserHeader), string(userID), string(user)} {
		if v = refBlankless(v); v != "" {
			return refNamespaced("user:", v)
		}
	}
	return ""
}

func refHashKey(h http.Header, paramsID, sessionID, userID, user refId, text string) string {
	for _, name := range reqkey.HashKeyHeaders {
		if v := refBlankless(h.Get(name)); v != "" {
			return v
		}
	}
	for _, v := range []refId{paramsID, user, sessionID, userID} {
		if s := refBlankless(string(v)); s != "" {
			return s
		}
	}
	return text
}

func refBlankless(s string) string { return strings.TrimSpace(s) }

func refNamespaced(kind, v string) string {
	if len(v) <= reqkey.MaxIDLen {
		return kind + v
	}
	sum := sha256.Sum256([]byte(v))
	return kind + "sha256:" + hex.EncodeToString(sum[:16])
}

// refRoutingText is what non-chat requests are matched on: /generate's text, prompt or input_ids, or
// the completion prompt (strings joined by newlines, token ids rendered as their decimal values).
func refRoutingText(b *refBody) string {
	for _, v := range []any{b.Text, b.Prompt, b.InputIDs} {
		if v == nil {
			continue
		}
		var sb strings.Builder
		refRenderPrompt(&sb, v)
		if sb.Len() > 0 {
			return sb.String()
		}
	}
	return ""
}

func refRenderPrompt(sb *strings.Builder, v any) {
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
			refRenderPrompt(sb, e)
		}
	}
}

// refHistoryKey serializes a chat conversation so that a conversation's key is a byte prefix of the
// key of any continuation of it (the same tools, messages appended). Tool schemas come first,
// sorted by function name, so they are stable across turns; then each message in order. Every
// free-text field is written behind a one-letter tag as its bytes followed by the byte 0xFF, which
// no UTF-8 text holds, and every message ends with ".", so moving text from one field or message
// to another always changes the key. A conversation with no text at all (only images, say) has an empty key: there is
// nothing a worker could have cached that we could match.
//
// The framing is kept small on purpose: the router's match ratio is matched bytes over key bytes,
// and bulky shared framing ("role: user, name: ...") would make unrelated short chats look alike.
// The common roles are one letter; other fields appear only when present.
//
//	tool    = "T" name· description· parameters·  (parameters as canonical JSON; x· is x, then 0xFF)
//	message = role { "n" name· | "i" tool_call_id· | "c" text part· | "f" name· arguments· } "."
//	role    = "s" | "d" | "u" | "a" | "t" | "r" other role·
func refHistoryKey(tools []refTool, messages []refMessage) string {
	if !refHasText(tools, messages) {
		return ""
	}
	size := 0
	for i := range messages {
		size += 16 + refTextSize(messages[i].Content)
	}
	buf := make([]byte, 0, size)
	if len(tools) > 0 {
		sorted := slices.Clone(tools)
		slices.SortStableFunc(sorted, func(a, b refTool) int { return strings.Compare(a.Function.Name, b.Function.Name) })
		for _, t := range sorted {
			buf = append(buf, 'T')
			buf = refField(buf, t.Function.Name)
			buf = refField(buf, t.Function.Description)
			buf = refField(buf, refCanonicalJSON(t.Function.Parameters))
		}
	}
	for i := range messages {
		m := &messages[i]
		buf = refAppendRole(buf, m.Role)
		if m.Name != "" {
			buf = append(buf, 'n')
			buf = refField(buf, m.Name)
		}
		if m.ToolCallID != "" {
			buf = append(buf, 'i')
			buf = refField(buf, m.ToolCallID)
		}
		buf = refAppendTextParts(buf, m.Content)
		for _, tc := range m.ToolCalls {
			buf = append(buf, 'f')
			buf = refField(buf, tc.Function.Name)
			buf = refField(buf, refArgumentsText(tc.Function.Arguments))
		}
		buf = append(buf, '.')
	}
	// buf is never written again: hand its bytes to the string instead of copying them, which
	// saves a copy of the whole conversation per request.
	return unsafe.String(unsafe.SliceData(buf), len(buf))
}

func refAppendRole(buf []byte, role string) []byte {
	switch role {
	case "system":
		return append(buf, 's')
	case "developer":
		return append(buf, 'd')
	case "user":
		return append(buf, 'u')
	case "assistant":
		return append(buf, 'a')
	case "tool":
		return append(buf, 't')
	}
	return refField(append(buf, 'r'), role)
}

func refField(buf []byte, s string) []byte {
	return append(append(buf, s...), 0xFF)
}

// refAppendTextParts writes the text of a message content: a string, or the text parts of a content
// array. Image, audio and other parts contribute nothing.
func refAppendTextParts(buf []byte, content any) []byte {
	switch c := content.(type) {
	case string:
		if c != "" {
			buf = append(buf, 'c')
			buf = refField(buf, c)
		}
	case []any:
		for _, part := range c {
			if text, ok := refPartText(part); ok && text != "" {
				buf = append(buf, 'c')
				buf = refField(buf, text)
			}
		}
	}
	return buf
}

func refPartText(part any) (string, bool) {
	switch p := part.(type) {
	case string:
		return p, true
	case map[string]any:
		if typ, _ := p["type"].(string); typ != "" && typ != "text" && typ != "input_text" {
			return "", false
		}
		text, ok := p["text"].(string)
		return text, ok
	}
	return "", false
}

func refTextSize(content any) int {
	if s, ok := content.(string); ok {
		return len(s)
	}
	return 64
}

func refHasText(tools []refTool, messages []refMessage) bool {
	if len(tools) > 0 {
		return true
	}
	for i := range messages {
		if len(messages[i].ToolCalls) > 0 {
			return true
		}
		switch c := messages[i].Content.(type) {
		case string:
			if c != "" {
				return true
			}
		case []any:
			for _, part := range c {
				if text, ok := refPartText(part); ok && text != "" {
					return true
				}
			}
		}
	}
	return false
}

// refArgumentsText is a tool call's arguments: the string as sent (OpenAI sends a JSON string), or the
// canonical JSON of an object some clients send instead.
func refArgumentsText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return refCanonicalJSON(v)
}

// refCanonicalJSON renders a decoded JSON value with object keys sorted (encoding/json sorts map
// keys), so the same schema always yields the same bytes whatever order the client wrote it in.
func refCanonicalJSON(v any) string {
	if v == nil {
		return ""
	}
	var sb bytes.Buffer
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	return strings.TrimSuffix(sb.String(), "\n")
}

// refTokenCount is a token count as the rate limits read it: a JSON number, truncated and clamped
// to [0, 1<<30]; anything else counts 0.
func refTokenCount(raw json.RawMessage) int {
	var v float64
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		if v, err2 := strconv.ParseFloat(string(raw), 64); err2 != nil && v > 0 {
			return 1 << 30 // beyond float64: clamped
		}
		return 0
	}
	switch {
	case !(v > 0):
		return 0
	case v >= 1<<30:
		return 1 << 30
	}
	return int(v)
}
