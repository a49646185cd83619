package protocol_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

var benchSizes = []struct {
	name string
	size int
}{
	{"4KiB", 4 << 10},
	{"64KiB", 64 << 10},
	{"512KiB", 512 << 10},
}

// agentChatBody returns an agent-style chat body of about size bytes: a system prompt, two tool
// schemas, then alternating user and assistant turns of prose until the size is reached. Content
// is plain strings so the same body also decodes into the plain baseline struct.
func agentChatBody(size int) []byte {
	r := rand.New(rand.NewPCG(7, uint64(size)))
	words := strings.Fields("the router sends each request to the worker whose prefix cache already " +
		"holds most of it without letting any worker drown under load while sessions stay sticky " +
		"func main return error nil if for range go test bench json decode")
	sentence := func(n int) string {
		var sb strings.Builder
		for i := range n {
			if i > 0 {
				sb.WriteByte(' ')
			}
			sb.WriteString(words[r.IntN(len(words))])
		}
		return sb.String()
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := struct {
		Model    string           `json:"model"`
		Stream   bool             `json:"stream"`
		Messages []msg            `json:"messages"`
		Tools    []map[string]any `json:"tools"`
	}{
		Model:  "meta-llama/Llama-3.1-8B-Instruct",
		Stream: true,
		Tools: []map[string]any{
			{"type": "function", "function": map[string]any{"name": "read_file", "description": "Read a file", "parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}, "required": []string{"path"}}}},
			{"type": "function", "function": map[string]any{"name": "run", "description": "Run a command", "parameters": map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string"}, "timeout": map[string]any{"type": "integer"}}}}},
		},
		Messages: []msg{{Role: "system", Content: sentence(60)}},
	}
	b, _ := json.Marshal(body)
	for n := len(b); ; {
		if n >= size {
			if b, _ = json.Marshal(body); len(b) >= size {
				return b
			}
			n = len(b)
		}
		role := "user"
		if len(body.Messages)%2 == 0 {
			role = "assistant"
		}
		m := msg{Role: role, Content: sentence(20 + r.IntN(60))}
		body.Messages = append(body.Messages, m)
		n += len(`,{"role":"","content":""}`) + len(m.Role) + len(m.Content)
	}
}

// chatAs renders the chat body chat, whose messages have string content, as a body of the
// Responses API and as one of the Messages API, as their clients send the same conversation,
// members in their order: the system prompt as instructions or system, flat function tools or
// input_schema tools, user turns as they are, assistant turns as the output items or content
// blocks the server returned. The Messages body carries Claude Code's cache_control markers, on
// the system, the last tool and the newest message.
func chatAs(chat []byte) (responses, messages []byte) {
	var c struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name        string `json:"name"`
				Description string `json:"description"`
				Parameters  any    `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(chat, &c); err != nil {
		panic(err)
	}
	type cacheControl struct {
		Type string `json:"type"`
	}
	marker := &cacheControl{"ephemeral"}
	type functionTool struct {
		Type        string `json:"type"`
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  any    `json:"parameters"`
		Strict      bool   `json:"strict"`
	}
	type tool struct {
		Name         string        `json:"name"`
		Description  string        `json:"description"`
		InputSchema  any           `json:"input_schema"`
		CacheControl *cacheControl `json:"cache_control,omitempty"`
	}
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type outputText struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	type outputMessage struct {
		Type    string       `json:"type"`
		ID      string       `json:"id"`
		Status  string       `json:"status"`
		Role    string       `json:"role"`
		Content []outputText `json:"content"`
	}
	type textBlock struct {
		Type         string        `json:"type"`
		Text         string        `json:"text"`
		CacheControl *cacheControl `json:"cache_control,omitempty"`
	}
	type blocksMessage struct {
		Role    string      `json:"role"`
		Content []textBlock `json:"content"`
	}
	var rTools []functionTool
	var mTools []tool
	for i, t := range c.Tools {
		f := t.Function
		rTools = append(rTools, functionTool{"function", f.Name, f.Description, f.Parameters, false})
		mt := tool{Name: f.Name, Description: f.Description, InputSchema: f.Parameters}
		if i == len(c.Tools)-1 {
			mt.CacheControl = marker
		}
		mTools = append(mTools, mt)
	}
	var system string
	var input []any
	var msgs []blocksMessage
	for i, m := range c.Messages {
		switch m.Role {
		case "system":
			system = m.Content
			continue
		case "assistant":
			input = append(input, outputMessage{"message", fmt.Sprintf("msg_%04d", i), "completed", m.Role,
				[]outputText{{"output_text", m.Content, []any{}}}})
		default:
			input = append(input, message{m.Role, m.Content})
		}
		block := textBlock{Type: "text", Text: m.Content}
		if i == len(c.Messages)-1 {
			block.CacheControl = marker
		}
		msgs = append(msgs, blocksMessage{m.Role, []textBlock{block}})
	}
	responses, _ = json.Marshal(struct {
		Model        string         `json:"model"`
		Instructions string         `json:"instructions"`
		Tools        []functionTool `json:"tools"`
		Input        []any          `json:"input"`
		Store        bool           `json:"store"`
		Stream       bool           `json:"stream"`
	}{c.Model, system, rTools, input, false, c.Stream})
	messages, _ = json.Marshal(struct {
		Model     string          `json:"model"`
		MaxTokens int             `json:"max_tokens"`
		System    []textBlock     `json:"system"`
		Tools     []tool          `json:"tools"`
		Messages  []blocksMessage `json:"messages"`
		Stream    bool            `json:"stream"`
	}{c.Model, 8192, []textBlock{{"text", system, marker}}, mTools, msgs, c.Stream})
	return responses, messages
}

// repeatedBody returns prefix, then unit repeated with sep between the copies, then suffix: a
// body of at least size bytes made of one small part many times over.
func repeatedBody(size int, prefix, unit, sep, suffix string) []byte {
	var b bytes.Buffer
	b.Grow(size + len(prefix) + len(unit) + len(suffix))
	b.WriteString(prefix)
	for first := true; b.Len() < size; first = false {
		if !first {
			b.WriteString(sep)
		}
		b.WriteString(unit)
	}
	b.WriteString(suffix)
	return b.Bytes()
}

// tinyPartsBody is a chat of one user message whose content is size bytes of 4-byte text parts.
func tinyPartsBody(size int) []byte {
	return repeatedBody(size, `{"model":"m","messages":[{"role":"user","content":[`,
		`{"type":"text","text":"abcd"}`, ",", `]}]}`)
}

// tinyMessagesBody is a chat of size bytes of one-letter user messages.
func tinyMessagesBody(size int) []byte {
	return repeatedBody(size, `{"model":"m","messages":[`, `{"role":"user","content":"a"}`, ",", `]}`)
}

// BenchmarkParse is the whole key derivation of one chat request: decode, session key, hash key and
// history key. Compare with BenchmarkPlainDecode of the same bodies.
func BenchmarkParse(b *testing.B) {
	h := http.Header{}
	h.Set("x-session-id", "bench-session")
	forSizes(b, agentChatBody, func(b *testing.B, body []byte) { benchParse(b, h, body) })
}

// forSizes runs bench on the body that body builds for each of benchSizes, in a sub-benchmark
// named for the size.
func forSizes(b *testing.B, body func(size int) []byte, bench func(b *testing.B, body []byte)) {
	for _, s := range benchSizes {
		body := body(s.size)
		b.Run(s.name, func(b *testing.B) { bench(b, body) })
	}
}

// perBody has b report allocations, and body's bytes, per operation: how every loop here is read.
func perBody(b *testing.B, body []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
}

// BenchmarkParseResponses is the whole key derivation of the conversation of BenchmarkParse sent
// as a Responses API body (see chatAs).
func BenchmarkParseResponses(b *testing.B) {
	benchmarkParseAgent(b, protocol.ParseResponses, func(chat []byte) []byte { r, _ := chatAs(chat); return r })
}

// BenchmarkParseMessages is the whole key derivation of the conversation of BenchmarkParse sent as
// a Messages API body (see chatAs).
func BenchmarkParseMessages(b *testing.B) {
	benchmarkParseAgent(b, protocol.ParseMessages, func(chat []byte) []byte { _, m := chatAs(chat); return m })
}

func benchmarkParseAgent(b *testing.B, parse func(reqkey.Header, []byte) (*protocol.Request, error), as func([]byte) []byte) {
	h := http.Header{}
	h.Set("x-session-id", "bench-session")
	forSizes(b, func(size int) []byte { return as(agentChatBody(size)) }, func(b *testing.B, body []byte) {
		perBody(b, body)
		for b.Loop() {
			r, err := parse(h, body)
			if err != nil || r.Text == "" {
				b.Fatalf("parse: %v", err)
			}
		}
	})
}

// BenchmarkParseAgentsPlain is the agent readers on the chat body of BenchmarkParse given to them
// token for token, its messages as "input" or "messages" (string contents and chat-shaped tools
// are valid in both APIs): what they cost beside Parse on the same JSON, the rest of the cost of
// BenchmarkParseResponses and BenchmarkParseMessages being their shapes' extra JSON.
func BenchmarkParseAgentsPlain(b *testing.B) {
	for _, p := range []struct {
		name  string
		parse func(reqkey.Header, []byte) (*protocol.Request, error)
		field string
	}{{"responses", protocol.ParseResponses, `"input":`}, {"messages", protocol.ParseMessages, `"messages":`}} {
		b.Run(p.name, func(b *testing.B) {
			benchmarkParseAgent(b, p.parse, func(chat []byte) []byte {
				return bytes.Replace(chat, []byte(`"messages":`), []byte(p.field), 1)
			})
		})
	}
}

// BenchmarkParseModel is the load-only reader of the agent chat body: only model and stream are
// read, the rest is only checked to be JSON.
func BenchmarkParseModel(b *testing.B) {
	forSizes(b, agentChatBody, func(b *testing.B, body []byte) {
		perBody(b, body)
		for b.Loop() {
			if r, err := protocol.ParseModel(nil, body); err != nil || r.Model == "" {
				b.Fatalf("ParseModel: %v", err)
			}
		}
	})
}

// BenchmarkParseTinyParts is Parse of a chat whose one message holds 4-byte text parts, the shape
// that costs the most per body byte: what is kept per part shows in B/op and allocs/op.
func BenchmarkParseTinyParts(b *testing.B) {
	benchmarkParseShape(b, tinyPartsBody)
}

// BenchmarkParseTinyMessages is Parse of a chat of one-letter messages: what is kept per message
// shows in B/op and allocs/op.
func BenchmarkParseTinyMessages(b *testing.B) {
	benchmarkParseShape(b, tinyMessagesBody)
}

func benchmarkParseShape(b *testing.B, shape func(size int) []byte) {
	forSizes(b, shape, func(b *testing.B, body []byte) { benchParse(b, nil, body) })
}

// benchParse is the measured loop of every Parse benchmark: one body, parsed again and again.
func benchParse(b *testing.B, h http.Header, body []byte) {
	perBody(b, body)
	for b.Loop() {
		r, err := protocol.ParseChat(h, body)
		if err != nil || r.Text == "" {
			b.Fatalf("Parse: %v", err)
		}
	}
}

// BenchmarkPlainDecode is the baseline: encoding/json decoding the same body into a plain struct.
func BenchmarkPlainDecode(b *testing.B) {
	forSizes(b, agentChatBody, func(b *testing.B, body []byte) {
		perBody(b, body)
		for b.Loop() {
			var v struct {
				Model    string
				Messages []struct{ Role, Content string }
			}
			if err := json.Unmarshal(body, &v); err != nil || len(v.Messages) == 0 {
				b.Fatalf("decode: %v", err)
			}
		}
	})
}

func TestAgentChatBodySizes(t *testing.T) {
	for _, s := range benchSizes {
		body := agentChatBody(s.size)
		if len(body) < s.size || len(body) > s.size+1024 {
			t.Errorf("%s body is %d bytes", s.name, len(body))
		}
		r, err := protocol.ParseChat(nil, body)
		if err != nil || !r.Chat || r.Text == "" {
			t.Errorf("%s body: %v %+v", s.name, err, r)
		}
		// The same conversation in the agent protocols' shapes has the same key.
		responses, messages := chatAs(body)
		for name, rendered := range map[string][]byte{"responses": responses, "messages": messages} {
			parse := protocol.ParseResponses
			if name == "messages" {
				parse = protocol.ParseMessages
			}
			if a, err := parse(nil, rendered); err != nil || a.Text != r.Text {
				t.Errorf("%s body as %s: %v, key %.60q, chat's %.60q", s.name, name, err, a.Text, r.Text)
			}
		}
	}
}

// twoMessagesBody is the chat body of the router's CPU profile: a system and a user message of
// size/2 bytes of words each.
func twoMessagesBody(size int) []byte {
	words := func(n int) string {
		return strings.Repeat("word ", n/5) + strings.Repeat("w", n%5)
	}
	return []byte(`{"model":"m","messages":[{"role":"system","content":"` + words(size/2) +
		`"},{"role":"user","content":"` + words(size/2) + `"}]}`)
}

// contentKinds are texts of different make for the two-message body: escapes every line in code,
// characters outside ASCII now and then in English, or everywhere in Chinese.
var contentKinds = []struct{ name, unit string }{
	{"prose", "the router sends each request to the worker whose prefix cache holds most of it "},
	{"code", `\tif err := r.Parse(body); err != nil {\n\t\treturn fmt.Errorf(\"parse: %w\", err)\n\t}\n`},
	{"typography", "the router’s choice — sticky sessions, “prefix” matches — stays cheap… "},
	{"chinese", "路由器将每个请求发送到其前缀缓存中已有大部分内容的工作节点，"},
}

// BenchmarkParseContent is Parse of two messages of about 2 KiB each of each kind of content.
func BenchmarkParseContent(b *testing.B) {
	for _, k := range contentKinds {
		text := strings.Repeat(k.unit, 2048/len(k.unit))
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + text +
			`"},{"role":"user","content":"` + text + `"}]}`)
		b.Run(k.name, func(b *testing.B) {
			benchParse(b, nil, body)
		})
	}
}

// BenchmarkParseTwoMessages4KiB is Parse of the body profiled under load: two messages of 2 KiB
// of prose, with a session header.
func BenchmarkParseTwoMessages4KiB(b *testing.B) {
	h := http.Header{}
	h.Set("x-session-id", "bench-session")
	body := twoMessagesBody(4 << 10)
	benchParse(b, h, body)
}

// toolsChatBody is the first turn of a coding agent: twenty tools whose schemas take about 40 KiB,
// as agents send on every turn, and two short messages. Most of its key is the canonical form of
// the schemas.
func toolsChatBody() []byte {
	var tools []any
	for i := range 20 {
		props := map[string]any{}
		for j := range 12 {
			props[fmt.Sprintf("param_%d", j)] = map[string]any{"type": "string", "enum": []string{"a", "b"},
				"description": "The absolute path to the file to read; must be within the workspace and readable"}
		}
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name":        fmt.Sprintf("tool_%02d", i),
			"description": "Reads a file from the local filesystem. You can access any file directly by using this tool.",
			"parameters":  map[string]any{"type": "object", "properties": props, "required": []string{"param_0"}, "additionalProperties": false}}})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "tools": tools, "messages": []any{
		map[string]any{"role": "system", "content": "You are a coding agent."},
		map[string]any{"role": "user", "content": "fix the failing test"}}})
	return b
}

// BenchmarkParseAgentTools is Parse of a chat whose key is mostly tool schemas in canonical form:
// schemas met for the first time, and met again, as an agent resends them every turn (the tools
// memo, toolsmemo.go).
func BenchmarkParseAgentTools(b *testing.B) {
	h := http.Header{}
	h.Set("x-session-id", "bench-session")
	body := toolsChatBody()
	b.Run("new", func(b *testing.B) {
		defer protocol.FreshToolsMemo()()
		perBody(b, body)
		for b.Loop() {
			protocol.FreshToolsMemo()
			if r, err := protocol.ParseChat(h, body); err != nil || r.Text == "" {
				b.Fatalf("Parse: %v", err)
			}
		}
	})
	b.Run("remembered", func(b *testing.B) { benchParse(b, h, body) })
}

// BenchmarkParseTurns is Parse of the turns of agent conversations of about 100 KiB and 400 KiB:
// each turn resends the conversation with a reply and a tool result of 1 KiB each appended, 32
// turns a conversation, each conversation its own (the conversation memo, convmemo.go).
func BenchmarkParseTurns(b *testing.B) {
	for _, size := range []int{100 << 10, 400 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			const turns = 32
			system := strings.Repeat("the agent reads the file then runs the tests ", 40)
			body := func(conv, turn int) []byte {
				msgs := []string{fmt.Sprintf(`{"role":"system","content":%q}`, system),
					fmt.Sprintf(`{"role":"user","content":"conversation %d: %s"}`, conv, strings.Repeat("fix the build ", size/14))}
				for t := range turn {
					msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"turn %d %s"}`, t, strings.Repeat("reply ", 170)),
						fmt.Sprintf(`{"role":"user","content":"tool result %d\\n%s"}`, t, strings.Repeat(`output\n`, 146)))
				}
				return []byte(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}`)
			}
			bodies := make([][][]byte, 4)
			for c := range bodies {
				for t := range turns {
					bodies[c] = append(bodies[c], body(c, t))
				}
			}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				c, t := i/turns, i%turns
				if _, err := protocol.ParseChat(nil, bodies[c%len(bodies)][t]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
