package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// benchBodies returns n chat request bodies with 4 KiB prompts that share a
// system prompt, as agent turns do, and 16 output tokens.
func benchBodies(n int, stream bool) [][]byte {
	system := words("system", 1024)
	out := make([][]byte, n)
	for i := range out {
		b, _ := json.Marshal(map[string]any{
			"model": "sim-model",
			"messages": []msg{
				{"system", system},
				{"user", words(fmt.Sprint("user", i), 3072)},
			},
			"max_tokens": 16, "ignore_eos": true, "stream": stream,
		})
		out[i] = b
	}
	return out
}

func reportRate(b *testing.B, start time.Time) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

// BenchmarkWorkerChat4KiB measures one worker at time-scale 0 through
// ServeHTTP: parsing, template, tokenizer, block hashing, cache, scheduler
// and response encoding, without the network.
func BenchmarkWorkerChat4KiB(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			w := newWorker(b, testConfig())
			bodies := benchBodies(64, stream)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				req := httptest.NewRequest("POST", "/v1/chat/completions", bytes.NewReader(bodies[i%len(bodies)]))
				rec := httptest.NewRecorder()
				w.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
			}
			reportRate(b, start)
		})
	}
}

// BenchmarkWorkerChat4KiBLoopback measures one worker at time-scale 0 over
// HTTP on loopback with concurrent clients.
func BenchmarkWorkerChat4KiBLoopback(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			fleet, err := StartLocal(1, testConfig())
			if err != nil {
				b.Fatal(err)
			}
			defer fleet.Close()
			url := fleet.URLs()[0] + "/v1/chat/completions"
			bodies := benchBodies(64, stream)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(4)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					body := bodies[next.Add(1)%int64(len(bodies))]
					resp, err := client.Post(url, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			reportRate(b, start)
		})
	}
}
