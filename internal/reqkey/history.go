package reqkey

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// historyKey serializes a chat conversation so that a conversation's key is a byte prefix of the
// key of any continuation of it (the same tools, messages appended). Tool schemas come first,
// sorted by function name, so they are stable across turns; then each message in order. Every
// field is written with a length prefix ("<len>:<bytes>") behind a one-letter tag, so moving text
// from one field to another always changes the key. A conversation with no text at all (only
// images, say) has an empty key: there is nothing a worker could have cached that we could match.
//
// Layout:  tool    = "t" lp(name) lp(description) lp(parameters as canonical JSON)
//
//	message = "m" lp(role) lp(name) lp(tool_call_id) { "c" lp(text part) } { "f" lp(name) lp(arguments) } "."
func historyKey(tools []tool, messages []message) string {
	if !hasText(tools, messages) {
		return ""
	}
	size := 0
	for i := range messages {
		size += 32 + textSize(messages[i].Content)
	}
	buf := make([]byte, 0, size)
	if len(tools) > 0 {
		sorted := slices.Clone(tools)
		slices.SortStableFunc(sorted, func(a, b tool) int { return strings.Compare(a.Function.Name, b.Function.Name) })
		for _, t := range sorted {
			buf = append(buf, 't')
			buf = lp(buf, t.Function.Name)
			buf = lp(buf, t.Function.Description)
			buf = lp(buf, canonicalJSON(t.Function.Parameters))
		}
	}
	for i := range messages {
		m := &messages[i]
		buf = append(buf, 'm')
		buf = lp(buf, m.Role)
		buf = lp(buf, m.Name)
		buf = lp(buf, m.ToolCallID)
		buf = appendTextParts(buf, m.Content)
		for _, tc := range m.ToolCalls {
			buf = append(buf, 'f')
			buf = lp(buf, tc.Function.Name)
			buf = lp(buf, argumentsText(tc.Function.Arguments))
		}
		buf = append(buf, '.')
	}
	return string(buf)
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
