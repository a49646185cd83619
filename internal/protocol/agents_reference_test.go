package protocol_test

// This file is a plain encoding/json reading of Responses and Messages bodies, the reference of
// the differential tests of ParseResponses and ParseMessages. It reads each object's members in
// document order with a json.Decoder, so that it sees every value of a repeated key, as the rules
// of the agent readers require (see agents.go): the last value of a key is the field's, null is
// its absence, and every value is checked. Values are then decoded into `any` and written out
// with strings.Builder, sort and encoding/json's encoder.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// refMember is one member of a JSON object.
type refMember struct {
	key string
	val json.RawMessage
}

// refMembers returns the members of the valid JSON object raw in document order.
func refMembers(raw json.RawMessage) []refMember {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		panic(err)
	}
	var ms []refMember
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			panic(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			panic(err)
		}
		ms = append(ms, refMember{key: tok.(string), val: v})
	}
	return ms
}

// refElements returns the elements of the valid JSON array raw.
func refElements(raw json.RawMessage) []json.RawMessage {
	var els []json.RawMessage
	if err := json.Unmarshal(raw, &els); err != nil {
		panic(err)
	}
	return els
}

// refKind names the JSON type of raw as encoding/json's type errors do.
func refKind(raw json.RawMessage) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// refChecker records the first type error of a body read in document order.
type refChecker struct {
	err *protocol.Error
}

func (c *refChecker) fail(path, value string) {
	if c.err == nil {
		c.err = &protocol.Error{Msg: fmt.Sprintf("invalid JSON body: field %q must not be a JSON %s", path, value)}
	}
}

// is reports whether raw is of one of kinds, and records a type error at path when it is not.
func (c *refChecker) is(path string, raw json.RawMessage, kinds ...string) bool {
	if slices.Contains(kinds, refKind(raw)) {
		return true
	}
	c.fail(path, refKind(raw))
	return false
}

// freeForm records a type error at path when raw holds a number a float64 cannot hold.
func (c *refChecker) freeForm(path string, raw json.RawMessage) {
	var v any
	var te *json.UnmarshalTypeError
	if err := json.Unmarshal(raw, &v); errors.As(err, &te) {
		c.fail(path, te.Value)
	}
}

// refString is the value of the JSON string raw, or "" for any other value.
func refString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// refSetID reads an id as chat does: a string's value, or a number as written; any other value
// leaves it as it was.
func refSetID(dst *string, raw json.RawMessage) {
	switch c := raw[0]; {
	case c == '"':
		*dst = refString(raw)
	case c == '-' || (c >= '0' && c <= '9'):
		*dst = string(raw)
	}
}

// refIDIn reads an object holding an id under name (session_params, metadata): each such value
// replaces the id, and one that is not an object leaves none.
func refIDIn(dst *string, raw json.RawMessage, name string) {
	*dst = ""
	if raw[0] != '{' {
		return
	}
	for _, m := range refMembers(raw) {
		if m.key == name {
			refSetID(dst, m.val)
		}
	}
}

// refObject is an object's members by key, the last value of each, without the null ones.
type refObject map[string]json.RawMessage

func refObjectOf(raw json.RawMessage) refObject {
	o := refObject{}
	for _, m := range refMembers(raw) {
		if string(m.val) == "null" {
			delete(o, m.key)
		} else {
			o[m.key] = m.val
		}
	}
	return o
}

func (o refObject) str(key string) string { return refString(o[key]) }

// refDecode is raw decoded into `any`: nil for an absent value.
func refDecode(raw json.RawMessage) any {
	var v any
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &v)
	}
	return v
}

// refWhole is the canonical JSON of the object raw without its cache_control member.
func refWhole(raw json.RawMessage) string {
	m := refDecode(raw).(map[string]any)
	delete(m, "cache_control")
	return refCanonicalJSON(m)
}

// refKey writes a history key.
type refKey struct {
	sb   strings.Builder
	text bool
}

// field writes s as a field: its bytes, then the byte 0xFF that no UTF-8 text holds.
func (k *refKey) field(s string) { k.sb.WriteString(s + "\xff") }

func (k *refKey) tagged(tag byte, s string) {
	if s != "" {
		k.text = true
		k.sb.WriteByte(tag)
		k.field(s)
	}
}

func (k *refKey) role(role string) {
	k.sb.Write(refAppendRole(nil, role))
}

func (k *refKey) String() string {
	if !k.text {
		return ""
	}
	return k.sb.String()
}

// refToolShape is refToolSchema's reference: how a protocol's tools are shaped.
type refToolShape struct {
	function, schema string
	nested           bool
}

var (
	refResponsesTools = refToolShape{function: "function", schema: "parameters", nested: true}
	refMessagesTools  = refToolShape{function: "custom", schema: "input_schema"}
)

// checkTools checks the tools array raw of the protocol shaped ts.
func (c *refChecker) checkTools(raw json.RawMessage, ts refToolShape) {
	for _, e := range refElements(raw) {
		if string(e) == "null" || !c.is("tools", e, "object") {
			continue
		}
		for _, m := range refMembers(e) {
			switch {
			case m.key == "name" || m.key == "description" || m.key == "type":
				c.is("tools."+m.key, m.val, "string", "null")
			case m.key == ts.schema:
				c.freeForm("tools."+ts.schema, m.val)
			case m.key == "function" && ts.nested:
				if string(m.val) == "null" || !c.is("tools.function", m.val, "object") {
					continue
				}
				for _, f := range refMembers(m.val) {
					switch f.key {
					case "name", "description":
						c.is("tools.function."+f.key, f.val, "string", "null")
					case ts.schema:
						c.freeForm("tools.function."+ts.schema, f.val)
					default:
						c.freeForm("tools.function", f.val)
					}
				}
			default:
				c.freeForm("tools", m.val)
			}
		}
	}
}

// writeTools writes the tools array raw of the protocol shaped ts, sorted by name.
func (k *refKey) writeTools(raw json.RawMessage, ts refToolShape) {
	type refTool struct {
		name, key string
	}
	var tools []refTool
	for _, e := range refElements(raw) {
		if string(e) == "null" {
			continue
		}
		t := refObjectOf(e)
		typ := t.str("type")
		if typ != "" && typ != ts.function {
			tools = append(tools, refTool{name: t.str("name"), key: "W" + refWhole(e) + "\xff"})
			continue
		}
		if fn, ok := t["function"]; ok && ts.nested {
			t = refObjectOf(fn)
		}
		var sub refKey
		sub.sb.WriteByte('T')
		sub.field(t.str("name"))
		sub.field(t.str("description"))
		sub.field(refCanonicalJSON(refDecode(t[ts.schema])))
		tools = append(tools, refTool{name: t.str("name"), key: sub.sb.String()})
	}
	slices.SortStableFunc(tools, func(a, b refTool) int { return strings.Compare(a.name, b.name) })
	for _, t := range tools {
		k.text = true
		k.sb.WriteString(t.key)
	}
}

// refParseResponses reads a Responses body as ParseResponses must.
func refParseResponses(h http.Header, raw []byte) (*protocol.Request, error) {
	if err := refObjectBody(raw); err != nil {
		return nil, err
	}
	var c refChecker
	var model, previousID, conversation, cacheKey, user, paramsID string
	var stream, noStore bool
	var maxTokens int
	var tools, instructions, input json.RawMessage
	for _, m := range refMembers(raw) {
		switch m.key {
		case "model":
			if c.is("model", m.val, "string", "null") {
				model = refString(m.val)
			}
		case "previous_response_id":
			if c.is("previous_response_id", m.val, "string", "null") {
				previousID = refString(m.val)
			}
		case "stream":
			if c.is("stream", m.val, "bool", "null") {
				stream = string(m.val) == "true"
			}
		case "store":
			if c.is("store", m.val, "bool", "null") {
				noStore = string(m.val) == "false"
			}
		case "max_output_tokens":
			maxTokens = refTokenCount(m.val)
		case "tools":
			tools = nil
			if string(m.val) != "null" && c.is("tools", m.val, "array") {
				tools = m.val
				c.checkTools(m.val, refResponsesTools)
			}
		case "instructions":
			instructions = nil
			if string(m.val) != "null" && c.is("instructions", m.val, "string") {
				instructions = m.val
			}
		case "input":
			input = nil
			if string(m.val) != "null" && c.is("input", m.val, "string", "array") {
				input = m.val
				c.checkInput(m.val)
			}
		case "conversation":
			if m.val[0] == '{' {
				refIDIn(&conversation, m.val, "id")
			} else {
				refSetID(&conversation, m.val)
			}
		case "prompt_cache_key":
			refSetID(&cacheKey, m.val)
		case "user":
			refSetID(&user, m.val)
		case "session_params":
			refIDIn(&paramsID, m.val, "session_id")
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	r := &protocol.Request{Model: model, Stream: stream, Chat: input != nil, PreviousResponseID: previousID, NoStore: noStore, MaxTokens: maxTokens}
	if r.Chat {
		r.Text = refResponsesKey(tools, instructions, input)
	}
	r.SessionKey = refSessionKeyOf(h, paramsID, []string{conversation, cacheKey}, []string{user})
	r.HashKey = refHashKeyOf(h, []string{conversation, cacheKey, user}, r.Text)
	return r, nil
}

// refObjectBody rejects a body that is not a valid JSON object, with Parse's words when it is
// empty or not an object at all.
func refObjectBody(raw []byte) error {
	trimmed := bytes.TrimLeft(raw, " \t\r\n")
	switch {
	case len(trimmed) == 0:
		return &protocol.Error{Msg: "request body is empty; expected a JSON object"}
	case trimmed[0] != '{':
		return &protocol.Error{Msg: "request body must be a JSON object"}
	case !json.Valid(raw):
		return &protocol.Error{Msg: "invalid JSON body"}
	}
	return nil
}

func (c *refChecker) checkInput(raw json.RawMessage) {
	if raw[0] == '"' {
		return
	}
	for _, e := range refElements(raw) {
		if string(e) == "null" || !c.is("input", e, "object") {
			continue
		}
		for _, m := range refMembers(e) {
			switch m.key {
			case "type", "role", "call_id", "name":
				c.is("input."+m.key, m.val, "string", "null")
			case "arguments", "content", "output", "summary", "encrypted_content":
				c.freeForm("input."+m.key, m.val)
			default:
				c.freeForm("input", m.val)
			}
		}
	}
}

func refResponsesKey(tools, instructions, input json.RawMessage) string {
	var k refKey
	if tools != nil {
		k.writeTools(tools, refResponsesTools)
	}
	if instructions != nil {
		k.sb.WriteByte('s')
		k.tagged('c', refString(instructions))
		k.sb.WriteByte('.')
	}
	if input[0] == '"' {
		k.sb.WriteByte('u')
		k.tagged('c', refString(input))
		k.sb.WriteByte('.')
		return k.String()
	}
	for _, e := range refElements(input) {
		if string(e) == "null" {
			continue
		}
		it := refObjectOf(e)
		switch it.str("type") {
		case "", "message":
			k.role(it.str("role"))
			k.parts('c', 'x', it["content"])
		case "function_call":
			k.text = true
			k.sb.WriteByte('f')
			k.field(it.str("call_id"))
			k.field(it.str("name"))
			k.field(refArgumentsText(refDecode(it["arguments"])))
		case "function_call_output":
			k.sb.WriteByte('o')
			k.field(it.str("call_id"))
			k.parts('c', 'x', it["output"])
		case "reasoning":
			k.sb.WriteByte('z')
			k.parts('y', 0, it["summary"])
			k.parts('k', 0, it["content"])
			k.tagged('e', it.str("encrypted_content"))
		default:
			k.text = true
			k.sb.WriteByte('J')
			k.field(refWhole(e))
		}
		k.sb.WriteByte('.')
	}
	return k.String()
}

// parts writes a content, an output or a summary behind tag: a string, or its text parts, and
// its refusal parts behind refusal unless it is 0.
func (k *refKey) parts(tag, refusal byte, raw json.RawMessage) {
	switch v := refDecode(raw).(type) {
	case string:
		k.tagged(tag, v)
	case []any:
		for _, p := range v {
			m, ok := p.(map[string]any)
			if !ok {
				continue
			}
			typ, _ := m["type"].(string)
			text, _ := m["text"].(string)
			switch typ {
			case "", "text", "input_text", "output_text", "summary_text", "reasoning_text":
				k.tagged(tag, text)
			case "refusal":
				if s, _ := m["refusal"].(string); refusal != 0 {
					k.tagged(refusal, s)
				}
			}
		}
	}
}

// refParseMessages reads a Messages body as ParseMessages must.
func refParseMessages(h http.Header, raw []byte) (*protocol.Request, error) {
	if err := refObjectBody(raw); err != nil {
		return nil, err
	}
	var c refChecker
	var model, userID string
	var stream bool
	var maxTokens int
	var tools, system, messages json.RawMessage
	for _, m := range refMembers(raw) {
		switch m.key {
		case "model":
			if c.is("model", m.val, "string", "null") {
				model = refString(m.val)
			}
		case "stream":
			if c.is("stream", m.val, "bool", "null") {
				stream = string(m.val) == "true"
			}
		case "tools":
			tools = nil
			if string(m.val) != "null" && c.is("tools", m.val, "array") {
				tools = m.val
				c.checkTools(m.val, refMessagesTools)
			}
		case "system":
			system = nil
			if string(m.val) != "null" && c.is("system", m.val, "string", "array") {
				system = m.val
				c.freeForm("system", m.val)
			}
		case "messages":
			messages = nil
			if string(m.val) != "null" && c.is("messages", m.val, "array") {
				messages = m.val
				c.checkMessages(m.val)
			}
		case "metadata":
			refIDIn(&userID, m.val, "user_id")
		case "max_tokens":
			maxTokens = refTokenCount(m.val)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	r := &protocol.Request{Model: model, Stream: stream, Chat: messages != nil, MaxTokens: maxTokens}
	if r.Chat {
		r.Text = refMessagesKey(tools, system, messages)
	}
	r.SessionKey = refSessionKeyOf(h, "", []string{userID}, nil)
	r.HashKey = refHashKeyOf(h, []string{userID}, r.Text)
	return r, nil
}

func (c *refChecker) checkMessages(raw json.RawMessage) {
	for _, e := range refElements(raw) {
		if string(e) == "null" || !c.is("messages", e, "object") {
			continue
		}
		for _, m := range refMembers(e) {
			switch m.key {
			case "role":
				c.is("messages.role", m.val, "string", "null")
			case "content":
				c.freeForm("messages.content", m.val)
			}
		}
	}
}

func refMessagesKey(tools, system, messages json.RawMessage) string {
	var k refKey
	if tools != nil {
		k.writeTools(tools, refMessagesTools)
	}
	if system != nil {
		k.sb.WriteByte('s')
		k.blocks(refDecode(system))
		k.sb.WriteByte('.')
	}
	for _, e := range refElements(messages) {
		if string(e) == "null" {
			continue
		}
		m := refObjectOf(e)
		k.role(m.str("role"))
		k.blocks(refDecode(m["content"]))
		k.sb.WriteByte('.')
	}
	return k.String()
}

// blocks writes a content: a string, or its blocks.
func (k *refKey) blocks(v any) {
	switch v := v.(type) {
	case string:
		k.tagged('c', v)
	case []any:
		for _, b := range v {
			if m, ok := b.(map[string]any); ok {
				k.block(m)
			}
		}
	}
}

func (k *refKey) block(m map[string]any) {
	str := func(key string) string { s, _ := m[key].(string); return s }
	switch str("type") {
	case "text":
		k.tagged('c', str("text"))
	case "image", "document":
	case "tool_use":
		k.text = true
		k.sb.WriteByte('f')
		k.field(str("id"))
		k.field(str("name"))
		k.field(refCanonicalJSON(m["input"]))
	case "tool_result":
		k.sb.WriteByte('o')
		k.field(str("tool_use_id"))
		k.blocks(m["content"])
		if m["is_error"] == true {
			k.sb.WriteByte('!')
		} else {
			k.sb.WriteByte(';')
		}
	case "thinking":
		k.tagged('k', str("thinking"))
	case "redacted_thinking":
		k.tagged('e', str("data"))
	default:
		k.text = true
		delete(m, "cache_control")
		k.sb.WriteByte('J')
		k.field(refCanonicalJSON(m))
	}
}

// refSessionKeyOf applies the session precedence: first, the session headers, the other
// session-scoped ids, the user header, the user-scoped ids.
func refSessionKeyOf(h http.Header, first string, sessions, users []string) string {
	if v := refBlankless(first); v != "" {
		return refNamespaced("session:", v)
	}
	for _, name := range reqkey.SessionHeaders {
		if v := refBlankless(h.Get(name)); v != "" {
			return refNamespaced("session:", v)
		}
	}
	for _, v := range sessions {
		if v = refBlankless(v); v != "" {
			return refNamespaced("session:", v)
		}
	}
	for _, v := range append([]string{h.Get(reqkey.UserHeader)}, users...) {
		if v = refBlankless(v); v != "" {
			return refNamespaced("user:", v)
		}
	}
	return ""
}

func refHashKeyOf(h http.Header, ids []string, text string) string {
	for _, name := range reqkey.HashKeyHeaders {
		if v := refBlankless(h.Get(name)); v != "" {
			return v
		}
	}
	for _, v := range ids {
		if v = refBlankless(v); v != "" {
			return v
		}
	}
	return text
}
