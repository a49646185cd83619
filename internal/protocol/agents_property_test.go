package protocol_test

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// This file generates random conversations of each agent protocol, each item or message with its
// normalized meaning (what the model is given of it), to test the properties of their keys: the
// prefix property turn by turn, no key shared by conversations of different meanings, and a key
// that no longer extends the last turn's once earlier text changes.

func normOf(v ...any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func canonOf(v any) string {
	return refCanonicalJSON(v)
}

// randParts returns a content as parts of the given types, drawn at random, and the (tag, text)
// pairs of their non-empty texts, tagged by tagOf (nothing for a part that writes nothing).
func randParts(r *rand.Rand, types []string, tagOf func(typ string) string) ([]any, [][2]string) {
	var parts []any
	var texts [][2]string
	for range r.IntN(4) {
		typ := types[r.IntN(len(types))]
		s := randText(r, 3)
		part := map[string]any{"type": typ}
		switch typ {
		case "input_image":
			part["image_url"] = s
		case "refusal":
			part["refusal"] = s
		default:
			part["text"] = s
			if r.IntN(4) == 0 {
				part["annotations"] = []any{}
			}
		}
		if tag := tagOf(typ); tag != "" && s != "" {
			texts = append(texts, [2]string{tag, s})
		}
		parts = append(parts, part)
	}
	return parts, texts
}

// randResponsesContent returns a content or output: a string, or parts.
func randResponsesContent(r *rand.Rand, tag string) (any, [][2]string) {
	if r.IntN(3) == 0 {
		s := randText(r, 4)
		if s == "" {
			return s, nil
		}
		return s, [][2]string{{tag, s}}
	}
	return randParts(r, []string{"input_text", "output_text", "text", "refusal", "input_image"}, func(typ string) string {
		switch typ {
		case "refusal":
			return "x"
		case "input_image":
			return ""
		}
		return tag
	})
}

func randResponsesItem(r *rand.Rand) convMessage {
	switch r.IntN(7) {
	case 0:
		call := map[string]any{"type": "function_call", "call_id": randText(r, 2), "name": randText(r, 2), "arguments": randText(r, 3)}
		if r.IntN(2) == 0 {
			call["id"], call["status"] = "fc_"+randText(r, 1), "completed"
		}
		return convMessage{call, normOf("f", call["call_id"], call["name"], call["arguments"])}
	case 1:
		output, texts := randResponsesContent(r, "c")
		id := randText(r, 2)
		return convMessage{map[string]any{"type": "function_call_output", "call_id": id, "output": output}, normOf("o", id, texts)}
	case 2:
		// A refusal in a reasoning item writes nothing.
		tagOf := func(tag string) func(string) string {
			return func(typ string) string { return map[bool]string{true: tag}[typ != "refusal"] }
		}
		summary, sums := randParts(r, []string{"summary_text", "summary_text", "refusal"}, tagOf("y"))
		content, texts := randParts(r, []string{"reasoning_text", "reasoning_text", "refusal"}, tagOf("k"))
		item := map[string]any{"type": "reasoning", "summary": summary, "content": content}
		enc := ""
		if r.IntN(2) == 0 {
			enc = randText(r, 3)
			item["encrypted_content"] = enc
		}
		return convMessage{item, normOf("z", sums, texts, enc)}
	case 3:
		item := map[string]any{"type": []string{"item_reference", "web_search_call", "mcp_call"}[r.IntN(3)], "id": randText(r, 2)}
		return convMessage{item, normOf("J", canonOf(item))}
	}
	role := randRole(r)
	content, texts := randResponsesContent(r, "c")
	m := map[string]any{"role": role, "content": content}
	if r.IntN(2) == 0 {
		m["type"] = "message"
	}
	return convMessage{m, normOf("m", role, texts)}
}

// randAgentTools returns tools of the shape of p, and their normalized meaning, sorted by name.
func randAgentTools(r *rand.Rand, p *agentProtocol) ([]any, string) {
	type normTool struct{ Name, Norm string }
	var tools []any
	var norm []normTool
	for range r.IntN(4) {
		if r.IntN(3) == 0 {
			t := map[string]any{"type": "web_search", "size": randText(r, 2)}
			if p == &messagesProtocol {
				t = map[string]any{"type": "bash_20250124", "name": randText(r, 2)}
			}
			name, _ := t["name"].(string)
			norm = append(norm, normTool{name, normOf("W", canonOf(t))})
			tools = append(tools, t)
			continue
		}
		name, desc := randText(r, 2), randText(r, 2)
		params := map[string]any{}
		for range r.IntN(3) {
			params[randText(r, 2)] = randText(r, 2)
		}
		var t map[string]any
		switch {
		case p == &messagesProtocol:
			t = map[string]any{"name": name, "description": desc, "input_schema": params}
		case r.IntN(2) == 0:
			t = map[string]any{"type": "function", "function": map[string]any{"name": name, "description": desc, "parameters": params}}
		default:
			t = map[string]any{"type": "function", "name": name, "description": desc, "parameters": params, "strict": true}
		}
		tools = append(tools, t)
		norm = append(norm, normTool{name, normOf("T", name, desc, canonOf(params))})
	}
	if len(norm) == 0 {
		return nil, ""
	}
	slices.SortStableFunc(norm, func(a, b normTool) int { return strings.Compare(a.Name, b.Name) })
	return tools, normOf(norm)
}

// randBlocks returns a content of blocks and their normalized meaning.
func randBlocks(r *rand.Rand, depth int) ([]any, []string) {
	var blocks []any
	var norm []string
	for range r.IntN(4) {
		var b map[string]any
		switch n := r.IntN(9); {
		case n < 3:
			s := randText(r, 4)
			b = map[string]any{"type": "text", "text": s}
			if s != "" {
				norm = append(norm, normOf("c", s))
			}
		case n == 3:
			b = map[string]any{"type": []string{"image", "document"}[r.IntN(2)], "source": map[string]any{"data": randText(r, 2)}}
		case n == 4:
			input := map[string]any{randText(r, 1): randText(r, 2)}
			b = map[string]any{"type": "tool_use", "id": randText(r, 2), "name": randText(r, 2), "input": input}
			norm = append(norm, normOf("f", b["id"], b["name"], canonOf(input)))
		case n == 5 && depth == 0:
			var content any
			var inner []string
			if r.IntN(2) == 0 {
				s := randText(r, 3)
				content = s
				if s != "" {
					inner = []string{normOf("c", s)}
				}
			} else {
				content, inner = randBlocks(r, depth+1)
			}
			isError := r.IntN(3) == 0
			b = map[string]any{"type": "tool_result", "tool_use_id": randText(r, 2), "content": content}
			if isError || r.IntN(2) == 0 {
				b["is_error"] = isError
			}
			norm = append(norm, normOf("o", b["tool_use_id"], isError, inner))
		case n == 6:
			s := randText(r, 3)
			b = map[string]any{"type": "thinking", "thinking": s, "signature": randText(r, 2)}
			if s != "" {
				norm = append(norm, normOf("k", s))
			}
		case n == 7:
			s := randText(r, 3)
			b = map[string]any{"type": "redacted_thinking", "data": s}
			if s != "" {
				norm = append(norm, normOf("e", s))
			}
		default:
			b = map[string]any{"type": "server_tool_use", "id": randText(r, 2), "input": map[string]any{"q": randText(r, 1)}}
			norm = append(norm, normOf("J", canonOf(b)))
		}
		if r.IntN(4) == 0 {
			b["cache_control"] = map[string]any{"type": "ephemeral"}
		}
		blocks = append(blocks, b)
	}
	return blocks, norm
}

func randMessagesMessage(r *rand.Rand) convMessage {
	role := []string{"user", "assistant"}[r.IntN(2)]
	if r.IntN(10) == 0 {
		role = randRole(r)
	}
	if r.IntN(4) == 0 {
		s := randText(r, 4)
		var norm []string
		if s != "" {
			norm = []string{normOf("c", s)}
		}
		return convMessage{map[string]any{"role": role, "content": s}, normOf(role, norm)}
	}
	blocks, norm := randBlocks(r, 0)
	return convMessage{map[string]any{"role": role, "content": blocks}, normOf(role, norm)}
}

// agentConv is a generated conversation of one protocol: what stays the same turn by turn (tools,
// instructions or system), and its items or messages.
type agentConv struct {
	p      *agentProtocol
	tools  []any
	system any // instructions or system; nil for none
	norm   string
	items  []convMessage
	// marked is the message whose last block carries cache_control (Messages), -1 for none.
	marked int
}

func randAgentConv(r *rand.Rand, p *agentProtocol) agentConv {
	c := agentConv{p: p, marked: -1}
	var toolsNorm string
	if r.IntN(2) == 0 {
		c.tools, toolsNorm = randAgentTools(r, p)
	}
	c.norm = toolsNorm
	if r.IntN(3) == 0 {
		// Instructions and a system are written as a leading system message, and mean what it
		// means.
		s := randText(r, 3)
		c.system = s
		var texts [][2]string
		var blocks []string
		if s != "" {
			texts, blocks = [][2]string{{"c", s}}, []string{normOf("c", s)}
		}
		if p == &messagesProtocol {
			if r.IntN(2) == 0 {
				c.system = []any{map[string]any{"type": "text", "text": s, "cache_control": map[string]any{"type": "ephemeral"}}}
			}
			c.norm += "|" + normOf("system", blocks)
		} else {
			c.norm += "|" + normOf("m", "system", texts)
		}
	}
	return c
}

func (c *agentConv) randItem(r *rand.Rand) convMessage {
	if c.p == &messagesProtocol {
		return randMessagesMessage(r)
	}
	return randResponsesItem(r)
}

// body is the request of the conversation with its items as they are now.
func (c *agentConv) body(t testing.TB) []byte {
	t.Helper()
	items := make([]any, len(c.items))
	for i, m := range c.items {
		items[i] = m.JSON
		if i == c.marked {
			items[i] = withMarker(m.JSON)
		}
	}
	body := map[string]any{"model": "m"}
	if len(c.tools) > 0 {
		body["tools"] = c.tools
	}
	if c.p == &messagesProtocol {
		body["messages"] = items
		if c.system != nil {
			body["system"] = c.system
		}
	} else {
		body["input"] = items
		if c.system != nil {
			body["instructions"] = c.system
		}
		// A conversation of one user message is often sent as a string.
		if m := c.items; len(m) == 1 && m[0].JSON["role"] == "user" && m[0].JSON["type"] == nil {
			if s, ok := m[0].JSON["content"].(string); ok {
				body["input"] = s
			}
		}
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withMarker returns a copy of the message m whose last block carries cache_control.
func withMarker(m map[string]any) map[string]any {
	blocks, ok := m["content"].([]any)
	if !ok || len(blocks) == 0 {
		return m
	}
	last, ok := blocks[len(blocks)-1].(map[string]any)
	if !ok {
		return m
	}
	last = maps.Clone(last)
	last["cache_control"] = map[string]any{"type": "ephemeral", "ttl": "5m"}
	blocks = append(slices.Clone(blocks[:len(blocks)-1]), last)
	m = maps.Clone(m)
	m["content"] = blocks
	return m
}

func (c *agentConv) key(t testing.TB) string {
	t.Helper()
	body := c.body(t)
	r, err := c.p.parse(nil, body)
	if err != nil {
		t.Fatalf("%s(%s): %v", c.p.name, body, err)
	}
	checkAgentBothWays(t, c.p, body)
	return r.Text
}

func (c *agentConv) meaning() string {
	var sb strings.Builder
	sb.WriteString(c.norm)
	for _, m := range c.items {
		sb.WriteString("|" + m.Norm)
	}
	return sb.String()
}

// For any conversation and any continuation of it (items or messages appended, the whole resent,
// Messages' cache_control marker moved to the newest message), the conversation's key is a byte
// prefix of the continuation's, and a continuation is longer when it has text.
func TestAgentKeyPrefixProperty(t *testing.T) {
	forEachAgentProtocol(t, 21, func(t *testing.T, p *agentProtocol, r *rand.Rand) {
		cases := scaled(3000)
		nonEmpty := 0
		for n := range cases {
			c := randAgentConv(r, p)
			var prev string
			for turn := range 1 + r.IntN(6) {
				for range 1 + r.IntN(2) {
					c.items = append(c.items, c.randItem(r))
				}
				c.marked = len(c.items) - 1
				k := c.key(t)
				if turn > 0 && !strings.HasPrefix(k, prev) {
					t.Fatalf("case %d turn %d: key %q does not extend %q\n%s", n, turn, k, prev, c.body(t))
				}
				if turn > 0 && k != "" && len(k) <= len(prev) {
					t.Fatalf("case %d turn %d: appended items added nothing to the key %q", n, turn, k)
				}
				if k != "" {
					nonEmpty++
				}
				prev = k
			}
		}
		if nonEmpty < cases {
			t.Fatalf("only %d turns with a key: the generator is too narrow", nonEmpty)
		}
	})
}

// keyReader reads a history key back by its grammar (see writeResponses and writeMessages).
type keyReader struct {
	s   string
	i   int
	bad bool
}

func (k *keyReader) more() bool { return !k.bad && k.i < len(k.s) }

func (k *keyReader) peek() byte {
	if k.i < len(k.s) {
		return k.s[k.i]
	}
	return 0
}

// take reads the byte c, and reports whether it was there.
func (k *keyReader) take(c byte) bool {
	if k.peek() == c {
		k.i++
		return true
	}
	return false
}

// field reads a field: its bytes up to the byte 0xFF that ends it.
func (k *keyReader) field() string {
	j := strings.IndexByte(k.s[k.i:], 0xFF)
	if j < 0 {
		k.bad = true
		return ""
	}
	v := k.s[k.i : k.i+j]
	k.i += j + 1
	return v
}

// role reads a role, or reports false when none starts at the reading position.
func (k *keyReader) role() (string, bool) {
	for c, role := range map[byte]string{'s': "system", 'd': "developer", 'u': "user", 'a': "assistant", 't': "tool"} {
		if k.take(c) {
			return role, true
		}
	}
	if k.take('r') {
		return k.field(), true
	}
	return "", false
}

// tools reads the tools the key starts with, and returns their meaning as the generator writes it.
func (k *keyReader) tools() string {
	type normTool struct{ Name, Norm string }
	var tools []normTool
	for k.more() {
		switch {
		case k.take('T'):
			name, desc, params := k.field(), k.field(), k.field()
			tools = append(tools, normTool{name, normOf("T", name, desc, params)})
		case k.take('W'):
			whole := k.field()
			var t struct{ Name string }
			_ = json.Unmarshal([]byte(whole), &t)
			tools = append(tools, normTool{t.Name, normOf("W", whole)})
		default:
			if len(tools) == 0 {
				return ""
			}
			return normOf(tools)
		}
	}
	return normOf(tools)
}

// texts reads tagged texts while their tag is one of tags.
func (k *keyReader) texts(tags string) [][2]string {
	var texts [][2]string
	for k.more() && strings.IndexByte(tags, k.peek()) >= 0 {
		tag := string(k.s[k.i])
		k.i++
		texts = append(texts, [2]string{tag, k.field()})
	}
	return texts
}

// decodeResponses reads the key of a Responses body back into the meaning of its conversation.
func decodeResponses(key string) (string, bool) {
	k := keyReader{s: key}
	meaning := k.tools()
	for k.more() {
		var item string
		switch {
		case k.take('f'):
			item = normOf("f", k.field(), k.field(), k.field())
		case k.take('o'):
			item = normOf("o", k.field(), k.texts("cx"))
		case k.take('z'):
			sums, texts := k.texts("y"), k.texts("k")
			enc := ""
			if k.take('e') {
				enc = k.field()
			}
			item = normOf("z", sums, texts, enc)
		case k.take('J'):
			item = normOf("J", k.field())
		default:
			role, ok := k.role()
			k.bad = k.bad || !ok
			item = normOf("m", role, k.texts("cx"))
		}
		k.bad = k.bad || !k.take('.')
		meaning += "|" + item
	}
	return meaning, !k.bad
}

// decodeMessages reads the key of a Messages body back into the meaning of its conversation.
func decodeMessages(key string) (string, bool) {
	k := keyReader{s: key}
	meaning := k.tools()
	// blocks reads blocks up to one of the ends, and returns them and the end.
	var blocks func(ends string) ([]string, byte)
	blocks = func(ends string) ([]string, byte) {
		var bs []string
		for k.more() {
			if c := k.peek(); strings.IndexByte(ends, c) >= 0 {
				k.i++
				return bs, c
			}
			switch {
			case k.take('c'):
				bs = append(bs, normOf("c", k.field()))
			case k.take('f'):
				bs = append(bs, normOf("f", k.field(), k.field(), k.field()))
			case k.take('o'):
				id := k.field()
				inner, end := blocks(";!")
				bs = append(bs, normOf("o", id, end == '!', inner))
			case k.take('k'):
				bs = append(bs, normOf("k", k.field()))
			case k.take('e'):
				bs = append(bs, normOf("e", k.field()))
			case k.take('J'):
				bs = append(bs, normOf("J", k.field()))
			default:
				k.bad = true
			}
		}
		k.bad = true // no end
		return bs, 0
	}
	for k.more() {
		role, ok := k.role()
		k.bad = k.bad || !ok
		bs, _ := blocks(".")
		meaning += "|" + normOf(role, bs)
	}
	return meaning, !k.bad
}

// The key of every conversation reads back, by its grammar, into exactly what the conversation
// means: so conversations that mean different things never share a key, whatever text is moved
// between fields, parts, items or blocks, however it forges the framing. Keys are also checked
// not to collide across the conversations generated.
func TestAgentKeyReadsBackIntoItsMeaning(t *testing.T) {
	forEachAgentProtocol(t, 22, func(t *testing.T, p *agentProtocol, r *rand.Rand) {
		decode := decodeResponses
		if p == &messagesProtocol {
			decode = decodeMessages
		}
		cases := scaled(20000)
		seen := make(map[string]string, cases)
		for range cases {
			c := randAgentConv(r, p)
			for range r.IntN(4) {
				c.items = append(c.items, c.randItem(r))
			}
			if r.IntN(2) == 0 {
				c.marked = r.IntN(len(c.items) + 1)
			}
			k := c.key(t)
			if k == "" {
				continue
			}
			if got, ok := decode(k); !ok || got != c.meaning() {
				t.Fatalf("the key %q reads back into\n%s (ok %v), not\n%s\n%s", k, got, ok, c.meaning(), c.body(t))
			}
			if prev, ok := seen[k]; ok && prev != c.meaning() {
				t.Fatalf("two different conversations share the key %q:\n%s\n%s", k, prev, c.meaning())
			}
			seen[k] = c.meaning()
		}
		if len(seen) < cases/4 {
			t.Fatalf("only %d distinct keys: the generator is too narrow to test anything", len(seen))
		}
	})
}

// Once an earlier item or message means something else, the key of any continuation no longer
// extends the conversation's: the worker that served it holds another prefix.
func TestAgentKeyBreaksWithEarlierChanges(t *testing.T) {
	forEachAgentProtocol(t, 23, func(t *testing.T, p *agentProtocol, r *rand.Rand) {
		cases := scaled(3000)
		changed := 0
		for range cases {
			c := randAgentConv(r, p)
			for range 1 + r.IntN(4) {
				c.items = append(c.items, c.randItem(r))
			}
			k := c.key(t)
			if k == "" {
				continue
			}
			j := r.IntN(len(c.items))
			old := c.items[j]
			for c.items[j].Norm == old.Norm {
				c.items[j] = c.randItem(r)
			}
			for range r.IntN(3) {
				c.items = append(c.items, c.randItem(r))
			}
			if k2 := c.key(t); strings.HasPrefix(k2, k) {
				t.Fatalf("item %d changed from %s to %s, and the key %q still extends %q", j, old.Norm, c.items[j].Norm, k2, k)
			}
			changed++
		}
		if changed < cases/3 {
			t.Fatalf("only %d conversations changed: the generator is too narrow", changed)
		}
	})
}
