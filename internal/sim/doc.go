// Package sim is a simulated vLLM worker: an http.Handler that serves the
// OpenAI-compatible endpoints vLLM serves (chat, completions, the Responses
// API with its stored responses) and the Anthropic Messages API, with a real
// prefix-cache model, a latency model, a FIFO scheduler and vLLM's
// Prometheus metric names, so the router can be tested, demonstrated and
// benchmarked without GPUs. Every API renders a conversation through the one
// chat template, so the same conversation hits the cache the same way
// whichever API carries it.
//
// The pieces:
//   - package prompt cuts text into pseudo-tokens and renders chat
//     conversations through a fixed template;
//   - package kvcache holds the KV blocks: chained block hashes, pins of
//     running requests, LRU eviction;
//   - this package schedules requests (at most MaxNumSeqs running, the rest
//     waiting in arrival order), charges time (TTFT = queue + overhead +
//     uncached tokens × per-token time, then one token per inter-token
//     latency), generates deterministic text, and serves HTTP and metrics.
//
// Every duration the worker sleeps passes through a Clock and is multiplied
// by Config.TimeScale; the durations it reports (Result, Stats and metrics)
// are simulated durations, the ones a real engine at full scale would show.
package sim
