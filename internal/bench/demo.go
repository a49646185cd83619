package bench

import (
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// The demo's settings: `cacheroute demo` runs exactly these, and `cacheroute bench --policies`
// starts its simulated fleet with DemoSim's values unless flags change them.

// DemoWorkers is the number of simulated workers of the demo.
const DemoWorkers = 4

// DemoConcurrency is the number of agent sessions the demo runs at once.
const DemoConcurrency = 10

// DemoPolicies are the routers the demo compares, written as --policies takes them.
var DemoPolicies = []string{policy.NameRoundRobin, policy.NameConsistentHash, cacheaware.Name + ":none", cacheaware.Name}

// DemoSim is the demo's simulated worker: the simulator's default latency model (5ms prefill
// overhead, 100µs per uncached prompt token, 5ms per output token) run ten times faster than
// real time, with a KV cache of 1,280 blocks of 16 tokens (20,480 tokens) per worker. The
// fleet's cache holds the sessions in progress only when each lives on one worker, and never
// all sessions of the run: a policy that spreads a session over every worker evicts.
func DemoSim() sim.Config {
	c := sim.DefaultConfig()
	c.KVCacheBlocks = 1280
	c.BlockSize = 16
	c.MaxNumSeqs = 8
	c.TimeScale = 0.1
	return c
}

// DemoAgent is the demo's agent workload: the bench's default agent workload, 32 sessions of
// 10 turns with a 1,500-token shared prefix in 3 tool-set variants, tool results of about 400
// tokens (lognormal) and a pause of 0 to 1 s before each later turn while the tool runs.
func DemoAgent() AgentConfig { return DefaultAgentConfig() }
