package cacheaware

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// growingChats returns bodies of sessions×turns chat requests, turn-major (turn 0 of every
// session, then turn 1 …). Each session's body grows turn by turn from about 3/4 of size to size:
// a shared system prompt, the session's own task, then one assistant reply and one user message
// per turn, as an agent loop resends its conversation.
func growingChats(size, sessions, turns int) [][]byte {
	return growingConversations(size, sessions, turns).chat
}

// conversationBodies are the same requests in each protocol's shape.
type conversationBodies struct {
	chat, responses, messages [][]byte
}

// growingConversations returns the requests of growingChats in the shape of each protocol, as its
// clients send them, members in their order: chat messages; a Responses body with the system
// prompt as instructions and assistant replies as the output items the server returned; a
// Messages body with content blocks, the system prompt marked with cache_control and the newest
// message marked too, as Claude Code marks them.
func growingConversations(size, sessions, turns int) conversationBodies {
	rng := rand.New(rand.NewPCG(7, 7))
	words := strings.Fields("the router keeps each conversation on the worker that holds its prefix cache so the next turn prefills only the new tail while the balance gate keeps any worker from drowning")
	text := func(n int) string {
		var sb strings.Builder
		for sb.Len() < n {
			sb.WriteString(words[rng.IntN(len(words))])
			sb.WriteByte(' ')
		}
		return sb.String()[:n]
	}
	system := text(size / 8)
	step := size / 4 / turns / 2
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type cacheControl struct {
		Type string `json:"type"`
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
	histories := make([][]msg, sessions)
	for s := range histories {
		histories[s] = []msg{{"system", system}, {"user", text(size*3/4 - size/8)}}
	}
	marker := &cacheControl{"ephemeral"}
	var out conversationBodies
	for t := range turns {
		for s := range histories {
			if t > 0 {
				histories[s] = append(histories[s], msg{"assistant", text(step)}, msg{"user", text(step)})
			}
			body, _ := json.Marshal(map[string]any{"model": "m", "messages": histories[s], "stream": true})
			out.chat = append(out.chat, body)

			var input []any
			var messages []blocksMessage
			for i, m := range histories[s][1:] {
				if m.Role == "assistant" {
					input = append(input, outputMessage{"message", fmt.Sprintf("msg_%d_%d", s, i), "completed", m.Role,
						[]outputText{{"output_text", m.Content, []any{}}}})
				} else {
					input = append(input, m)
				}
				block := textBlock{Type: "text", Text: m.Content}
				if i == len(histories[s])-2 {
					block.CacheControl = marker
				}
				messages = append(messages, blocksMessage{m.Role, []textBlock{block}})
			}
			body, _ = json.Marshal(struct {
				Model        string `json:"model"`
				Instructions string `json:"instructions"`
				Input        []any  `json:"input"`
				Stream       bool   `json:"stream"`
			}{"m", system, input, true})
			out.responses = append(out.responses, body)
			body, _ = json.Marshal(struct {
				Model     string          `json:"model"`
				MaxTokens int             `json:"max_tokens"`
				System    []textBlock     `json:"system"`
				Messages  []blocksMessage `json:"messages"`
				Stream    bool            `json:"stream"`
			}{"m", 8192, []textBlock{{"text", system, marker}}, messages, true})
			out.messages = append(out.messages, body)
		}
	}
	return out
}

// meanSize is the mean length of bodies, for b.SetBytes.
func meanSize(bodies [][]byte) int64 {
	total := 0
	for _, body := range bodies {
		total += len(body)
	}
	return int64(total / len(bodies))
}

var benchSizes = []struct {
	name string
	size int
}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"512KiB", 512 << 10}}

// BenchmarkDecision is the whole cache_aware decision for one request, as the proxy runs it:
// parse the body and derive the keys, look the session up, match and insert in the prefix tree,
// over 8 workers. Each session's history grows turn by turn.
func BenchmarkDecision(b *testing.B) {
	benchmarkDecision(b, protocol.ParseChat, func(c conversationBodies) [][]byte { return c.chat })
}

// BenchmarkDecisionResponses is BenchmarkDecision of the same conversations sent to the Responses
// API.
func BenchmarkDecisionResponses(b *testing.B) {
	benchmarkDecision(b, protocol.ParseResponses, func(c conversationBodies) [][]byte { return c.responses })
}

// BenchmarkDecisionMessages is BenchmarkDecision of the same conversations sent to the Messages
// API.
func BenchmarkDecisionMessages(b *testing.B) {
	benchmarkDecision(b, protocol.ParseMessages, func(c conversationBodies) [][]byte { return c.messages })
}

func benchmarkDecision(b *testing.B, parse func(reqkey.Header, []byte) (*protocol.Request, error), shape func(conversationBodies) [][]byte) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			pool, _ := fleet(b, 8)
			bodies := shape(growingConversations(sz.size, 8, 8))
			headers := make([]http.Header, 8)
			for s := range headers {
				headers[s] = http.Header{"X-Session-Id": {fmt.Sprintf("session-%d", s)}}
			}
			var p *Policy
			b.SetBytes(meanSize(bodies))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i%len(bodies) == 0 { // a fresh router for every full replay, so turns really grow
					b.StopTimer()
					p = newPolicy(defaultOptions())
					b.StartTimer()
				}
				body := bodies[i%len(bodies)]
				r, err := parse(headers[i%8], body)
				if err != nil {
					b.Fatal(err)
				}
				if r.Text == "" {
					b.Fatal("empty history key: the benchmark would measure nothing")
				}
				in := policy.Input{Context: b.Context(), Request: r, Model: r.Model, Candidates: pool.All(), All: pool.All()}
				d := p.Select(in)
				p.Accepted(in, d)
				if d.Worker == nil {
					b.Fatal("no worker")
				}
				i++
			}
		})
	}
}

// The three shapes of a conversation have one history key, so the decision benchmarks of the
// three protocols match and insert the same keys.
func TestGrowingConversationsHaveOneKeyInEveryShape(t *testing.T) {
	c := growingConversations(4<<10, 2, 3)
	for i := range c.chat {
		chat, err1 := protocol.ParseChat(nil, c.chat[i])
		responses, err2 := protocol.ParseResponses(nil, c.responses[i])
		messages, err3 := protocol.ParseMessages(nil, c.messages[i])
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatal(err)
		}
		if chat.Text == "" || responses.Text != chat.Text || messages.Text != chat.Text {
			t.Fatalf("request %d: keys differ:\n%.80q\n%.80q\n%.80q", i, chat.Text, responses.Text, messages.Text)
		}
	}
}

// BenchmarkPlainDecode is the baseline of BenchmarkDecision: encoding/json decoding the same bodies
// into a plain struct, the least any JSON-reading router must do.
func BenchmarkPlainDecode(b *testing.B) {
	type plain struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			bodies := growingChats(sz.size, 8, 8)
			b.SetBytes(meanSize(bodies))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				var v plain
				if err := json.Unmarshal(bodies[i%len(bodies)], &v); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkDecisionUnderPressure is the cache_aware decision once the workers' KV capacities are
// known, at about 100 KB prompts, with 1,000 sessions resident over 8 workers (125 each, sharing
// a 30 KB system prompt): "resident" is a turn of a resident session (parse, select, accept and
// the end that updates its working set), "new" the placement of a session not seen before (parse
// and select: the fit of its working set on every worker and the predicted first token of each).
func BenchmarkDecisionUnderPressure(b *testing.B) {
	const sessions, workersN, size = 1000, 8, 100 << 10
	pool, ws := fleet(b, workersN)
	for _, w := range ws {
		w.SetKVCapacity(8_000_000) // 125 sessions of about 25k tokens fit with room to spare
	}
	o := defaultOptions()
	o.Pressure = &PressureOptions{Admission: true, AdmissionTimeout: time.Minute, AdmissionQueue: 16}
	p := newPolicy(o)
	rng := rand.New(rand.NewPCG(3, 3))
	text := func(n int) string {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = "abcdefghij klmnopqrst uvwxyz"[rng.IntN(28)]
		}
		return string(buf)
	}
	system := text(30 << 10)
	body := func(s int, turns ...string) []byte {
		return []byte(chat(system, append([]string{fmt.Sprintf("session %d: %s", s, text(size-(30<<10)-2<<10))}, turns...), ""))
	}
	turn := func(s int, body []byte, done bool) policy.Decision {
		r, err := protocol.ParseChat(http.Header{"X-Session-Id": {fmt.Sprintf("session-%d", s)}}, body)
		if err != nil {
			b.Fatal(err)
		}
		in := policy.Input{Context: b.Context(), Request: r, Model: r.Model, Candidates: pool.All(), All: pool.All(), Size: len(body)}
		d := p.Select(in)
		if d.Worker == nil {
			b.Fatalf("session %d: no worker (%s)", s, d.Label)
		}
		if done {
			p.Accepted(in, d)
			p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: len(body) / 4, Output: 500})
		}
		return d
	}
	next := make([][]byte, 64) // the next turn of the first 64 sessions
	for s := range sessions {
		first := body(s)
		turn(s, first, true)
		if s < len(next) {
			next[s] = []byte(strings.TrimSuffix(string(first), "]}") + fmt.Sprintf(`,{"role":"assistant","content":%q},{"role":"user","content":%q}]}`, text(1<<10), text(1<<10)))
		}
	}
	b.Run("resident", func(b *testing.B) {
		b.SetBytes(int64(len(next[0])))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if d := turn(i%len(next), next[i%len(next)], true); d.Label != LabelSessionMatch {
				b.Fatalf("a resident session's turn was %s", d.Label)
			}
			i++
		}
	})
	b.Run("new", func(b *testing.B) {
		fresh := body(sessions)
		b.SetBytes(int64(len(fresh)))
		b.ReportAllocs()
		for b.Loop() {
			turn(sessions, fresh, false)
		}
	})
}
