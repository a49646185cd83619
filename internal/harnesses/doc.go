// Package harnesses holds the end-to-end tests that run the real agent CLIs, Claude Code and
// Codex CLI at pinned versions, against a cacheroute router in front of simulated vLLM workers
// (internal/sim), all in this process on 127.0.0.1. They check what a new user would see: each
// CLI completes a multi-turn session, every request of it lands on one worker under the
// cache_aware policy, and the worker's prefix cache serves a growing part of each turn.
//
// The CLIs come from npm, installed by .ci/run (or by the tests themselves) into one prefix,
// .bin/agent-clis at the repository root or $CACHEROUTE_AGENT_CLIS. They run in a temporary
// HOME with telemetry, update checks and every other remote feature off, with their HTTP proxy
// set to a loopback trap that fails the test if anything tries to leave the machine through it,
// and traced with strace (where it is installed; in CI it must be): any connection or datagram
// to an address off the loopback (a DNS query included) fails the test too.
// Without npm or the CLIs the tests skip, except in CI (CI=true), where they fail.
package harnesses
