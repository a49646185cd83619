package config

import (
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// StaticWorker is one worker given on the command line or in the config file, with its role.
type StaticWorker struct {
	URL  string
	Role workers.Role
}

// roleFlag is one flag that gives workers of one role: its name, its values, the role.
type roleFlag struct {
	flag   string
	values []string
	role   workers.Role
}

// roleFlags are the static worker lists by role, with their flags, in the order they join.
func (c Config) roleFlags() []roleFlag {
	return []roleFlag{
		{"worker-urls", c.WorkerURLs, workers.RoleColocated},
		{"prefill", c.Prefill, workers.RolePrefill},
		{"decode", c.Decode, workers.RoleDecode},
	}
}

// StaticWorkers are --worker-urls (colocated), then --prefill and --decode, each in the order
// given. The roles take effect with --vllm-pd-disaggregation; without it every worker takes whole
// requests.
func (c Config) StaticWorkers() []StaticWorker {
	var out []StaticWorker
	for _, l := range c.roleFlags() {
		for _, u := range l.values {
			out = append(out, StaticWorker{URL: u, Role: l.role})
		}
	}
	return out
}

// validateStaticWorkers checks every static worker URL, under its own flag, and refuses a worker
// given in two roles, naming it: a worker has one role.
func validateStaticWorkers(bad func(flag, format string, args ...any), c Config) {
	seen := map[tenant.URL]string{} // → the flag that gave it first
	for _, l := range c.roleFlags() {
		for _, raw := range l.values {
			u, err := tenant.ParseURL(raw)
			if err != nil {
				bad(l.flag, "%v", err)
				continue
			}
			if first, ok := seen[u]; ok && first != l.flag {
				bad(l.flag, "worker %s is also given by --%s: a worker has one role", u.Redacted(), first)
				continue
			}
			seen[u] = l.flag
		}
	}
}
