package protocol_test

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// The memory bound is checked on bodies large enough that the fixed costs of a parse vanish beside
// the per-part ones: 64 MiB for the shapes the bound was set for (4-byte content parts, one-letter
// messages), 8 MiB for the others, whose ratio does not depend on the size. The race detector
// slows parsing down by an order of magnitude, so under it the bodies are smaller.
var bigBodySize, bodySize = func() (int, int) {
	if raceEnabled {
		return 2 << 20, 512 << 10
	}
	return 64 << 20, 8 << 20
}()

// tinyShapes are bodies made of one tiny part many times over, each at a level of the request
// schema, so that any cost paid per part shows as a multiple of the body size.
var tinyShapes = []struct {
	name string
	body func(size int) []byte
	big  bool // checked at bigBodySize
}{
	{"4-byte content parts", tinyPartsBody, true},
	{"one-letter messages", tinyMessagesBody, true},
	{"empty messages", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":"a"},`, `{}`, ",", `]}`)
	}, false},
	{"string content parts", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":[`, `"ab"`, ",", `]}]}`)
	}, false},
	{"empty content parts", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":["a",`, `{}`, ",", `]}]}`)
	}, false},
	{"tiny tool calls", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"role":"assistant","tool_calls":[`,
			`{"function":{"name":"f","arguments":"1"}}`, ",", `]}]}`)
	}, false},
	{"empty tool calls", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"tool_calls":[`, `{}`, ",", `]}]}`)
	}, false},
	{"empty tools", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[`, `{}`, ",", `]}`)
	}, false},
	{"unsorted tools", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[`,
			`{"function":{"name":"b"}},{"function":{"name":"a"}}`, ",", `]}`)
	}, false},
	{"tool parameters of tiny members", func(n int) []byte {
		// Distinct keys in descending order: the most work for the sort of the canonical form.
		var b bytes.Buffer
		b.Grow(n + 64)
		b.WriteString(`{"messages":[],"tools":[{"function":{"name":"f","parameters":{`)
		for i := 36*36*36*36*36 - 1; b.Len() < n; i-- {
			if b.Len() > 64 {
				b.WriteByte(',')
			}
			key := strconv.FormatInt(int64(i), 36)
			b.WriteString(`"` + key + `":0`)
		}
		b.WriteString(`}}}]}`)
		return b.Bytes()
	}, false},
	{"tool parameters of one repeated member", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[{"function":{"name":"f","parameters":{`,
			`"":0`, ",", `}}}]}`)
	}, false},
	{"tool parameters of empty objects", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[{"function":{"name":"f","parameters":[`,
			`{}`, ",", `]}}]}`)
	}, false},
	{"object arguments of tiny numbers", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"tool_calls":[{"function":{"arguments":[`,
			`1`, ",", `]}}]}]}`)
	}, false},
	{"repeated messages keys", func(n int) []byte {
		return repeatedBody(n, `{`, `"messages":[{"content":"a"}]`, ",", `}`)
	}, false},
	{"token id prompt", func(n int) []byte {
		return repeatedBody(n, `{"prompt":[`, `7`, ",", `]}`)
	}, false},
	{"string prompts", func(n int) []byte {
		return repeatedBody(n, `{"prompt":[`, `"a"`, ",", `]}`)
	}, false},
	{"unknown nested arrays", func(n int) []byte {
		return repeatedBody(n, `{"x":[`, `[]`, ",", `],"messages":[{"content":"a"}]}`)
	}, false},
	// The keys of these outgrow their bodies: each byte of invalid UTF-8 is read as U+FFFD, three
	// bytes long, and the canonical form of 1e20 is written out in full.
	{"invalid UTF-8 content", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":"`, "\xff", "", `"}]}`)
	}, false},
	{"tool parameters of large numbers", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[{"function":{"parameters":[`, `1e20`, ",", `]}}]}`)
	}, false},
	// The most a key written in one pass takes beside the canonicalizer's records: half the
	// body is content whose bound is three times its size, so that the bound on the key is
	// twice the body, and half is members of one key, each with a record and none in the key.
	{"repeated members beside invalid UTF-8 content", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":"`+strings.Repeat("\xff", n/2)+`"}],"tools":[{"function":{"parameters":{`,
			`"":0`, ",", `}}}]}`)
	}, false},
	// The bound on the key of this one is six times the body: the canonical form of a number
	// may be 25 bytes long. Its key is counted first.
	{"tool parameters of small floats", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[{"function":{"parameters":[`, `0.5`, ",", `]}}]}`)
	}, false},
}

// parseAllocs returns the bytes Parse allocates for body, and the request it returns.
func parseAllocs(t testing.TB, body []byte) (uint64, *protocol.Request) {
	t.Helper()
	return parseAllocsWith(t, protocol.ParseChat, body)
}

// parseAllocsWith returns the bytes parse allocates for body, and the request it returns.
func parseAllocsWith(t testing.TB, parse func(reqkey.Header, []byte) (*protocol.Request, error), body []byte) (uint64, *protocol.Request) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := parse(nil, body)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return after.TotalAlloc - before.TotalAlloc, r
}

// Parsing a body allocates at most three times its size, whatever the body is made of: nothing is
// kept per content part, message, tool or tool call beyond what it adds to the key. Where the key
// itself outgrows that, the parse allocates at most the key and the body's size once more. The
// bytes allocated bound the peak memory of the parse from above.
func TestParseMemoryIsBoundedByBodySizeForTinyParts(t *testing.T) {
	for _, shape := range tinyShapes {
		t.Run(shape.name, func(t *testing.T) {
			size := bodySize
			if shape.big {
				size = bigBodySize
			}
			checkParseMemory(t, protocol.ParseChat, shape.body(size))
		})
	}
}

// checkParseMemory fails unless parse allocates at most three times the body, or the key and the
// body's size once more, for a body that has a key.
func checkParseMemory(t *testing.T, parse func(reqkey.Header, []byte) (*protocol.Request, error), body []byte) {
	t.Helper()
	allocated, r := parseAllocsWith(t, parse, body)
	ratio := float64(allocated) / float64(len(body))
	t.Logf("%d bytes allocated for a body of %d bytes (%.2fx), key %d bytes (%.2fx)",
		allocated, len(body), ratio, len(r.Text), float64(len(r.Text))/float64(len(body)))
	if bound := max(3*len(body), len(r.Text)+len(body)); allocated > uint64(bound) {
		t.Errorf("parsing allocated %d bytes (%.2f times the body), want at most %d", allocated, ratio, bound)
	}
	if r.Text == "" {
		t.Errorf("no routing text for the body")
	}
}

// agentTinyShapes are the agent protocols' bodies made of one tiny part many times over, at each
// level of their schemas.
var agentTinyShapes = []struct {
	p    *agentProtocol
	name string
	body func(size int) []byte
	big  bool // checked at bigBodySize
}{
	{&responsesProtocol, "4-byte content parts", func(n int) []byte {
		return repeatedBody(n, `{"input":[{"role":"user","content":[`, `{"type":"input_text","text":"abcd"}`, ",", `]}]}`)
	}, true},
	{&responsesProtocol, "one-letter items", func(n int) []byte {
		return repeatedBody(n, `{"input":[`, `{"role":"user","content":"a"}`, ",", `]}`)
	}, true},
	{&responsesProtocol, "empty items", func(n int) []byte { return repeatedBody(n, `{"input":[{"content":"a"},`, `{}`, ",", `]}`) }, false},
	{&responsesProtocol, "null items", func(n int) []byte { return repeatedBody(n, `{"input":[{"content":"a"},`, `null`, ",", `]}`) }, false},
	{&responsesProtocol, "empty parts", func(n int) []byte {
		return repeatedBody(n, `{"input":[{"content":[{"text":"a"},`, `{}`, ",", `]}]}`)
	}, false},
	{&responsesProtocol, "tiny function calls", func(n int) []byte {
		return repeatedBody(n, `{"input":[`, `{"type":"function_call","call_id":"c","name":"f","arguments":"1"}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "tiny outputs", func(n int) []byte {
		return repeatedBody(n, `{"input":[`, `{"type":"function_call_output","output":"1"}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "tiny reasoning", func(n int) []byte {
		return repeatedBody(n, `{"input":[`, `{"type":"reasoning","summary":[{"text":"a"}]}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "tiny items of another type", func(n int) []byte {
		return repeatedBody(n, `{"input":[`, `{"type":"x"}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "an item of tiny members", func(n int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"input":[{"type":"x"`)
		for i := 36*36*36*36*36 - 1; b.Len() < n; i-- {
			b.WriteString(`,"` + strconv.FormatInt(int64(i), 36) + `":0`)
		}
		b.WriteString(`}]}`)
		return b.Bytes()
	}, false},
	{&responsesProtocol, "empty tools", func(n int) []byte { return repeatedBody(n, `{"input":[],"tools":[`, `{}`, ",", `]}`) }, false},
	{&responsesProtocol, "unsorted tools", func(n int) []byte {
		return repeatedBody(n, `{"input":[],"tools":[`, `{"name":"b"},{"function":{"name":"a"}}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "named tools of another type", func(n int) []byte {
		return repeatedBody(n, `{"input":[],"tools":[`, `{"type":"x","name":"b"},{"type":"x","name":"a"}`, ",", `]}`)
	}, false},
	{&responsesProtocol, "invalid UTF-8 content", func(n int) []byte {
		return repeatedBody(n, `{"input":[{"content":"`, "\xff", "", `"}]}`)
	}, false},
	{&messagesProtocol, "4-byte text blocks", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"role":"user","content":[`, `{"type":"text","text":"abcd"}`, ",", `]}]}`)
	}, true},
	{&messagesProtocol, "one-letter messages", func(n int) []byte {
		return repeatedBody(n, `{"messages":[`, `{"role":"user","content":"a"}`, ",", `]}`)
	}, true},
	{&messagesProtocol, "empty messages", func(n int) []byte { return repeatedBody(n, `{"messages":[{"content":"a"},`, `{}`, ",", `]}`) }, false},
	{&messagesProtocol, "empty blocks", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":[`, `{}`, ",", `]}]}`)
	}, false},
	{&messagesProtocol, "marked blocks", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":[`, `{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}`, ",", `]}]}`)
	}, false},
	{&messagesProtocol, "tiny tool uses", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":[`, `{"type":"tool_use","id":"i","name":"f","input":{}}`, ",", `]}]}`)
	}, false},
	{&messagesProtocol, "nested tool results", func(n int) []byte {
		return repeatedBody(n, `{"messages":[{"content":[`, `{"type":"tool_result","content":[{"type":"tool_result","content":"a"}]}`, ",", `]}]}`)
	}, false},
	{&messagesProtocol, "empty tools", func(n int) []byte { return repeatedBody(n, `{"messages":[],"tools":[`, `{}`, ",", `]}`) }, false},
	{&messagesProtocol, "server tools", func(n int) []byte {
		return repeatedBody(n, `{"messages":[],"tools":[`, `{"type":"x","name":"b"},{"type":"x","name":"a"}`, ",", `]}`)
	}, false},
}

// Parsing a Responses or Messages body allocates at most three times its size too, whatever it
// is made of.
func TestParseAgentMemoryIsBoundedByBodySizeForTinyParts(t *testing.T) {
	for _, shape := range agentTinyShapes {
		t.Run(shape.p.name+"/"+shape.name, func(t *testing.T) {
			size := bodySize
			if shape.big {
				size = bigBodySize
			}
			checkParseMemory(t, shape.p.parse, shape.body(size))
		})
	}
}

// keyMemory is a Header without headers that gives memory for keys from a buffer of its own, and
// counts what it gave.
type keyMemory struct {
	buf   []byte
	asked int
}

func (m *keyMemory) Get(string) string { return "" }

func (m *keyMemory) KeyMemory(n int) []byte {
	m.asked++
	if n > cap(m.buf) {
		return make([]byte, 0, n)
	}
	return m.buf[:0:n]
}

// A request read with a Header that gives memory for keys (the proxy's: its body's) has its
// history key or routing text written there, in every protocol, and no other copy of it made.
func TestAKeyIsWrittenIntoTheMemoryTheHeaderGives(t *testing.T) {
	long := strings.Repeat("word ", 1000)
	for _, tc := range []struct {
		name  string
		parse func(reqkey.Header, []byte) (*protocol.Request, error)
		body  string
	}{
		{"chat", protocol.ParseChat, `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"completions", protocol.ParseCompletions, `{"model":"m","prompt":"` + long + `"}`},
		{"responses", protocol.ParseResponses, `{"model":"m","input":"` + long + `"}`},
		{"messages", protocol.ParseMessages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + long + `"}]}`},
	} {
		mem := &keyMemory{buf: make([]byte, 0, 4*len(tc.body))}
		r, err := tc.parse(mem, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		heap, err := tc.parse(nil, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Text != heap.Text || !strings.Contains(r.Text, long) {
			t.Errorf("%s: the key written into given memory differs from the key on the heap", tc.name)
		}
		if mem.asked != 1 || unsafe.StringData(r.Text) != unsafe.SliceData(mem.buf[:1]) {
			t.Errorf("%s: the key is not in the memory given (asked %d times)", tc.name, mem.asked)
		}
	}
}
