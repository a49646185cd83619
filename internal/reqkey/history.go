package reqkey

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
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
	for i := range tools {
		size += 32 + len(tools[i].name) + len(tools[i].description) + len(tools[i].params)
	}
	for i := range messages {
		size += messages[i].size()
	}
	// A Builder grows without zeroing the bytes it is about to overwrite, and hands them to
	// String without copying them: the key costs one allocation of about its own size.
	var sb strings.Builder
	sb.Grow(size)
	if len(tools) > 0 {
		sorted := slices.Clone(tools)
		slices.SortStableFunc(sorted, func(a, b tool) int { return bytes.Compare(a.name, b.name) })
		for _, t := range sorted {
			sb.WriteByte('T')
			lp(&sb, t.name)
			lp(&sb, t.description)
			lp(&sb, canonicalJSON(t.params))
		}
	}
	for i := range messages {
		m := &messages[i]
		appendRole(&sb, m.role)
		if len(m.name) > 0 {
			sb.WriteByte('n')
			lp(&sb, m.name)
		}
		if len(m.toolCallID) > 0 {
			sb.WriteByte('i')
			lp(&sb, m.toolCallID)
		}
		appendTextParts(&sb, m)
		for _, tc := range m.toolCalls {
			sb.WriteByte('f')
			lp(&sb, tc.name)
			lp(&sb, tc.arguments())
		}
		sb.WriteByte('.')
	}
	return sb.String()
}

// message is one element of messages, as far as the history key reads it. Its byte slices may
// point into the request body.
type message struct {
	role, name, toolCallID []byte
	text                   []byte   // content given as a string
	parts                  [][]byte // the non-empty texts of content given as an array
	toolCalls              []toolCall
}

// toolCall is one element of a message's tool_calls: its function's name and arguments.
type toolCall struct {
	name     []byte
	args     []byte // the arguments string, or the raw JSON of other arguments (nil for none)
	argsJSON bool   // args is raw JSON
}

// tool is one element of tools: its function's name, description and raw JSON parameters.
type tool struct {
	name, description, params []byte
}

// size is about the number of bytes m adds to a history key.
func (m *message) size() int {
	n := 16 + len(m.role) + len(m.name) + len(m.toolCallID) + len(m.text)
	for _, p := range m.parts {
		n += 8 + len(p)
	}
	for _, tc := range m.toolCalls {
		n += 16 + len(tc.name) + len(tc.args)
	}
	return n
}

func appendRole(sb *strings.Builder, role []byte) {
	switch string(role) {
	case "system":
		sb.WriteByte('s')
	case "developer":
		sb.WriteByte('d')
	case "user":
		sb.WriteByte('u')
	case "assistant":
		sb.WriteByte('a')
	case "tool":
		sb.WriteByte('t')
	default:
		sb.WriteByte('r')
		lp(sb, role)
	}
}

// lp writes s behind its length prefix: "<len>:<bytes>".
func lp(sb *strings.Builder, s []byte) {
	var n [20]byte
	sb.Write(strconv.AppendInt(n[:0], int64(len(s)), 10))
	sb.WriteByte(':')
	sb.Write(s)
}

// appendTextParts writes the text of a message content: a string, or the text parts of a content
// array. Image, audio and other parts contribute nothing.
func appendTextParts(sb *strings.Builder, m *message) {
	if len(m.text) > 0 {
		sb.WriteByte('c')
		lp(sb, m.text)
	}
	for _, text := range m.parts {
		sb.WriteByte('c')
		lp(sb, text)
	}
}

func hasText(tools []tool, messages []message) bool {
	if len(tools) > 0 {
		return true
	}
	for i := range messages {
		if len(messages[i].toolCalls) > 0 || len(messages[i].text) > 0 || len(messages[i].parts) > 0 {
			return true
		}
	}
	return false
}

// arguments is a tool call's arguments: the string as sent (OpenAI sends a JSON string), or the
// canonical JSON of an object some clients send instead.
func (c *toolCall) arguments() []byte {
	if !c.argsJSON {
		return c.args
	}
	return canonicalJSON(c.args)
}
