package cacheaware

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// growingChats returns bodies of sessions×turns chat requests, turn-major (turn 0 of every
// session, then turn 1 …). Each session's body grows turn by turn from about 3/4 of size to size:
// a shared system prompt, the session's own task, then one assistant reply and one user message
// per turn, as an agent loop resends its conversation.
func growingChats(size, sessions, turns int) [][]byte {
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
	histories := make([][]msg, sessions)
	for s := range histories {
		histories[s] = []msg{{"system", system}, {"user", text(size*3/4 - size/8)}}
	}
	var out [][]byte
	for t := range turns {
		for s := range histories {
			if t > 0 {
				histories[s] = append(histories[s], msg{"assistant", text(step)}, msg{"user", text(step)})
			}
			body, _ := json.Marshal(map[string]any{"model": "m", "messages": histories[s], "stream": true})
			out = append(out, body)
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
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			pool, _ := fleet(b, 8)
			bodies := growingChats(sz.size, 8, 8)
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
				r, err := reqkey.Parse(headers[i%8], body)
				if err != nil {
					b.Fatal(err)
				}
				if r.Text == "" {
					b.Fatal("empty history key: the benchmark would measure nothing")
				}
				in := policy.Input{Context: b.Context(), Request: r, Model: r.Model, Candidates: pool.All(), All: pool.All()}
				d := p.Select(in)
				p.Commit(in, d)
				if d.Worker == nil {
					b.Fatal("no worker")
				}
				i++
			}
		})
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
