// Package bench replays multi-turn LLM workloads against one or more OpenAI- or
// Anthropic-compatible targets and reports, side by side, what a router's placement is worth:
// prompt-cache hit rate, time to first token, end-to-end latency, throughput, decision labels
// and load balance.
//
// The pieces, each in its own file:
//   - workloads (pure): the agent generator (agent.go), the Mooncake trace loader
//     (mooncake.go), the multi-turn conversations loader (conversations.go) and the replay of
//     real agent sessions from hash-only traces (cctrace.go) all produce a Workload: sessions of
//     turns. A turn says which messages to add to the conversation; the
//     runner adds the server's actual reply between turns (conversation.go);
//   - the runner (runner.go, client.go): drives one target over HTTP with streaming requests,
//     measures TTFT at the first content-bearing event and records each response's usage and
//     router headers;
//   - the APIs (api*.go): one sender per protocol behind one interface (chat completions,
//     Responses with the whole input or chained by previous_response_id, Anthropic Messages),
//     each building a turn's request and reading its stream's events;
//   - load sampling (sampler.go) and worker metrics scraping (promtext.go);
//   - in-process fleets (inprocess.go): simulated workers and, per --policies entry, one router
//     or several replicas (sharing their sessions through a redis-server the bench starts),
//     configured by the entry's router args (routerargs.go), or no router: the oracle
//     (oracle.go) or HAProxy with a stick table (haproxy.go);
//   - KV pressure (pressure.go): the oversubscription planned and achieved, the sessions each
//     worker served;
//   - the report (report.go, stats.go) and its renderings: an aligned table, JSON, Markdown
//     and an SVG chart (render_*.go); live progress on a terminal (progress.go).
package bench
