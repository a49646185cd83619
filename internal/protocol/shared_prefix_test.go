package protocol_test

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// This file tests what the framing of the history key is for: two requests whose conversations
// agree up to some byte of one text (a document, a preamble, few-shot examples at the start of a
// message, then different questions) have keys that agree up to that byte, as the prompts a worker
// caches do, so the prefix tree sees what they share.

// proseWords are the words shared texts are made of: plain words, characters outside ASCII,
// characters JSON escapes, and pieces of the key's own framing.
var proseWords = []string{"the", "router", "sends", "each", "request", "to", "a", "worker", " ", " ", ". ", ", ",
	"\n", "\t", `"`, `\`, "<b>", "&", "é", "è", "日本語", "👋", "\u2028", "ÿ", "\uFFFD", "12:", "uc", "0:", ".", "c",
	"\u00ff.uc", "T", "f"}

// proseOf returns about n bytes of random prose.
func proseOf(r *rand.Rand, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(proseWords[r.IntN(len(proseWords))])
	}
	return sb.String()
}

// startingAlike returns two different non-empty texts that start with the same k bytes (the first
// k bytes of a, which are valid UTF-8 on their own).
func startingAlike(r *rand.Rand) (a, b string, k int) {
	n := r.IntN(300)
	switch r.IntN(8) {
	case 0:
		n = 0
	case 1:
		n = 20_000 + r.IntN(20_000) // a document
	}
	shared := proseOf(r, n)
	for a == b || a == "" || b == "" {
		a, b = shared+proseOf(r, r.IntN(200)), shared+proseOf(r, r.IntN(200))
	}
	return a, b, len(shared)
}

// sharedShape is where a conversation holds the text two requests start alike: body returns the
// JSON body with the text in that place, the rest of the conversation drawn from r (the same
// before the text for the same seed), and some other messages or items after it drawn from after.
type sharedShape struct {
	name  string
	parse func(reqkey.Header, []byte) (*protocol.Request, error)
	body  func(r, after *rand.Rand, text string) map[string]any
}

// chatMessages are n random chat messages, as JSON values (an empty array for none, so that a
// body always has a conversation).
func chatMessages(r *rand.Rand, n int) []any {
	ms := []any{}
	for range n {
		ms = append(ms, randMessage(r).JSON)
	}
	return ms
}

func responsesItems(r *rand.Rand, n int) []any {
	items := []any{}
	for range n {
		items = append(items, randResponsesItem(r).JSON)
	}
	return items
}

func messagesMessages(r *rand.Rand, n int) []any {
	ms := []any{}
	for range n {
		ms = append(ms, randMessagesMessage(r).JSON)
	}
	return ms
}

func chatWith(r, after *rand.Rand, m map[string]any) map[string]any {
	tools, _ := randTools(r)
	msgs := append(chatMessages(r, r.IntN(4)), m)
	body := map[string]any{"model": "m", "messages": append(msgs, chatMessages(after, after.IntN(3))...)}
	if tools != nil {
		body["tools"] = tools
	}
	return body
}

func responsesWith(r, after *rand.Rand, item map[string]any) map[string]any {
	return agentWith(r, after, &responsesProtocol, "instructions", "input", responsesItems, item)
}

func messagesWith(r, after *rand.Rand, m map[string]any) map[string]any {
	return agentWith(r, after, &messagesProtocol, "system", "messages", messagesMessages, m)
}

// agentWith is a body of p with random tools, random text under textKey half the time, and under
// listKey a few random entries drawn by entries, then x, then entries drawn from after.
func agentWith(r, after *rand.Rand, p *agentProtocol, textKey, listKey string, entries func(*rand.Rand, int) []any, x map[string]any) map[string]any {
	tools, _ := randAgentTools(r, p)
	body := map[string]any{"model": "m", "tools": tools}
	if r.IntN(2) == 0 {
		body[textKey] = randText(r, 3)
	}
	list := append(entries(r, r.IntN(4)), x)
	body[listKey] = append(list, entries(after, after.IntN(3))...)
	return body
}

var sharedShapes = []sharedShape{
	{"chat/content", protocol.ParseChat, func(r, after *rand.Rand, text string) map[string]any {
		return chatWith(r, after, map[string]any{"role": randRole(r), "content": text})
	}},
	{"chat/text part", protocol.ParseChat, func(r, after *rand.Rand, text string) map[string]any {
		parts, _ := randContent(r)
		before, _ := parts.([]any)
		later, _ := randContent(after)
		rest, _ := later.([]any)
		content := append(append(before, map[string]any{"type": "text", "text": text}), rest...)
		return chatWith(r, after, map[string]any{"role": randRole(r), "name": randText(r, 1), "content": content})
	}},
	{"chat/tool call arguments", protocol.ParseChat, func(r, after *rand.Rand, text string) map[string]any {
		call := map[string]any{"id": "1", "type": "function", "function": map[string]any{"name": randText(r, 2), "arguments": text}}
		return chatWith(r, after, map[string]any{"role": "assistant", "tool_calls": []any{call}})
	}},
	{"chat/tool result", protocol.ParseChat, func(r, after *rand.Rand, text string) map[string]any {
		return chatWith(r, after, map[string]any{"role": "tool", "tool_call_id": randText(r, 2), "content": text})
	}},
	{"responses/input string", protocol.ParseResponses, func(r, after *rand.Rand, text string) map[string]any {
		tools, _ := randAgentTools(r, &responsesProtocol)
		return map[string]any{"tools": tools, "instructions": randText(r, 3), "input": text}
	}},
	{"responses/instructions", protocol.ParseResponses, func(r, after *rand.Rand, text string) map[string]any {
		tools, _ := randAgentTools(r, &responsesProtocol)
		return map[string]any{"tools": tools, "instructions": text, "input": responsesItems(after, after.IntN(3))}
	}},
	{"responses/message", protocol.ParseResponses, func(r, after *rand.Rand, text string) map[string]any {
		return responsesWith(r, after, map[string]any{"role": randRole(r), "content": text})
	}},
	{"responses/input_text part", protocol.ParseResponses, func(r, after *rand.Rand, text string) map[string]any {
		parts, _ := randParts(r, []string{"input_text", "input_image"}, func(string) string { return "" })
		rest, _ := randParts(after, []string{"input_text", "input_image"}, func(string) string { return "" })
		content := append(append(parts, map[string]any{"type": "input_text", "text": text}), rest...)
		return responsesWith(r, after, map[string]any{"type": "message", "role": "user", "content": content})
	}},
	{"responses/function_call_output", protocol.ParseResponses, func(r, after *rand.Rand, text string) map[string]any {
		return responsesWith(r, after, map[string]any{"type": "function_call_output", "call_id": randText(r, 2), "output": text})
	}},
	{"messages/system", protocol.ParseMessages, func(r, after *rand.Rand, text string) map[string]any {
		tools, _ := randAgentTools(r, &messagesProtocol)
		return map[string]any{"tools": tools, "system": text, "messages": messagesMessages(after, after.IntN(3))}
	}},
	{"messages/content", protocol.ParseMessages, func(r, after *rand.Rand, text string) map[string]any {
		return messagesWith(r, after, map[string]any{"role": "user", "content": text})
	}},
	{"messages/text block", protocol.ParseMessages, func(r, after *rand.Rand, text string) map[string]any {
		blocks := []any{map[string]any{"type": "text", "text": randText(r, 2)}, map[string]any{"type": "text", "text": text, "cache_control": map[string]any{"type": "ephemeral"}}}
		return messagesWith(r, after, map[string]any{"role": "user", "content": blocks})
	}},
	{"messages/tool_result", protocol.ParseMessages, func(r, after *rand.Rand, text string) map[string]any {
		result := map[string]any{"type": "tool_result", "tool_use_id": randText(r, 2), "content": text}
		return messagesWith(r, after, map[string]any{"role": "user", "content": []any{result}})
	}},
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// Two requests whose conversations are the same up to one text, in which they share the first k
// bytes and then differ, have keys that share the first k bytes of that text: the keys agree from
// their start through the shared k bytes, whatever comes after. Where the text starts in the key
// is found from two requests that differ at its first byte.
func TestKeyOfTextsStartingAlikeSharesTheirStart(t *testing.T) {
	for i, shape := range sharedShapes {
		t.Run(shape.name, func(t *testing.T) {
			const cases = 300
			seeds := rand.New(rand.NewPCG(uint64(i), 19))
			for c := range cases {
				seed := seeds.Uint64()
				text1, text2, k := startingAlike(seeds)
				key := func(text string, after uint64) string {
					body, err := json.Marshal(shape.body(rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(after, 2)), text))
					if err != nil {
						t.Fatal(err)
					}
					req, err := shape.parse(nil, body)
					if err != nil {
						t.Fatalf("%s", err)
					}
					return req.Text
				}
				// The text starts where the keys of texts that differ at their first byte part.
				start := commonPrefix(key("A", 0), key("B", 0))
				k1, k2 := key(text1, seeds.Uint64()), key(text2, seeds.Uint64())
				if got := commonPrefix(k1, k2); got < start+k {
					t.Fatalf("case %d: texts sharing %d bytes from byte %d of the key: keys share %d bytes\n%.300q\n%.300q",
						c, k, start, got, k1, k2)
				}
				if k >= 20_000 && commonPrefix(k1, k2) < k {
					t.Fatalf("case %d: a shared document of %d bytes is not a shared prefix", c, k)
				}
			}
		})
	}
}

// The requests: one user message each, the same document followed by questions of
// different lengths. The document is a shared prefix of their keys, and most of each key.
func TestHistoryKeyOfOneMessageStartingWithADocumentSharesTheDocument(t *testing.T) {
	document := strings.Repeat("The router keeps each worker's prefix cache in view; ", 300)
	keys := make([]string, 0, 3)
	for _, question := range []string{"Summarize it.", "What does it say of the cache? " + strings.Repeat("Be brief. ", 10),
		strings.Repeat("List every claim. ", 100)} {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": document + "\n\n" + question}}})
		keys = append(keys, keyOf(t, body))
	}
	for i := 1; i < len(keys); i++ {
		if n := commonPrefix(keys[0], keys[i]); n < len("uc")+len(document) {
			t.Errorf("keys 0 and %d share %d bytes, want the tag and all %d bytes of the document\n%.40q\n%.40q",
				i, n, len(document), keys[0], keys[i])
		}
	}
}
