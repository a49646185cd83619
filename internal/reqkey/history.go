package reqkey

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// historyKey serializes a chat conversation so that a conversation's key is a byte prefix of the
// key of any continuation of it (the same tools, messages appended). Tool schemas come first,
// sorted by function name, so they are stable across turns; then each message in order. Every
// free-text field is written with a length prefix ("<len>:<bytes>") behind a one-letter tag, and
// every message ends with ".", so moving text from one field or message to another always changes
// the key. A conversation with no text at all (only images, say) has an empty key: there is
// nothing a worker could have cached that we could match.
//
// The framing is kept small on purpose: the router's match ratio is matched bytes over key bytes,
// and bulky shared framing ("role: user, name: ...") would make unrelated short chats look alike.
// The common roles are one letter; other fields appear only when present.
//
//	tool    = "T" lp(name) lp(description) lp(parameters as canonical JSON)
//	message = role { "n" lp(name) | "i" lp(tool_call_id) | "c" lp(text part) | "f" lp(name) lp(arguments) } "."
//	role    = "s" | "d" | "u" | "a" | "t" | "r" lp(other role)
func historyKey(tools []tool, messages []message) string {
	if !hasText(tools, messages) {
		return ""
	}
	size := 0
	for i := range messages {
		size += 16 + textSize(messages[i].Content)
	}
	buf := make([]byte, 0, size)
	if len(tools) > 0 {
		sorted := slices.Clone(tools)
		slices.SortStableFunc(sorted, func(a, b tool) int { return strings.Compare(a.Function.Name, b.Function.Name) })
		for _, t := range sorted {
			buf = append(buf, 'T')
			buf = lp(buf, t.Function.Name)
			buf = lp(buf, t.Function.Description)
			buf = lp(buf, canonicalJSON(t.Function.Parameters))
		}
	}
	for i := range messages {
		m := &messages[i]
		buf = appendRole(buf, m.Role)
		if m.Name != "" {
			buf = append(buf, 'n')
			buf = lp(buf, m.Name)
		}
		if m.ToolCallID != "" {
			buf = append(buf, 'i')
			buf = lp(buf, m.ToolCallID)
		}
		buf = appendTextParts(buf, m.Content)
		for _, tc := range m.ToolCalls {
			buf = append(buf, 'f')
			buf = lp(buf, tc.Function.Name)
			buf = lp(buf, argumentsText(tc.Function.Arguments))
		}
		buf = append(buf, '.')
	}
	// buf is never written again: hand its bytes to the string instead of copying them, which
	// saves a copy of the whole conversation per request.
	return unsafe.String(unsafe.SliceData(buf), len(buf))
}

func appendRole(buf []byte, role string) []byte {
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
	return lp(append(buf, 'r'), role)
}

func lp(buf []byte, s string) []byte {
	buf = strconv.AppendInt(buf, int64(len(s)), 10)
	buf = append(buf, ':')
	return append(buf, s...)
}

// appendTextParts writes the text of a message content: a string, or the text parts of a content
// array. Image, audio and other parts contribute nothing.
func appendTextParts(buf []byte, content any) []byte {
	switch c := content.(type) {
	case string:
		if c != "" {
			buf = append(buf, 'c')
			buf = lp(buf, c)
		}
	case []any:
		for _, part := range c {
			if text, ok := partText(part); ok && text != "" {
				buf = append(buf, 'c')
				buf = lp(buf, text)
			}
		}
	}
	return buf
}

func partText(part any) (string, bool) {
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

func textSize(content any) int {
	if s, ok := content.(string); ok {
		return len(s)
	}
	return 64
}

func hasText(tools []tool, messages []message) bool {
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
				if text, ok := partText(part); ok && text != "" {
					return true
				}
			}
		}
	}
	return false
}

// argumentsText is a tool call's arguments: the string as sent (OpenAI sends a JSON string), or the
// canonical JSON of an object some clients send instead.
func argumentsText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return canonicalJSON(v)
}

// canonicalJSON renders a decoded JSON value with object keys sorted (encoding/json sorts map
// keys), so the same schema always yields the same bytes whatever order the client wrote it in.
func canonicalJSON(v any) string {
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
