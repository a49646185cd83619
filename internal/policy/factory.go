package policy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/session"
)

// Env is what the router gives every policy it builds, besides the policy's own options: the
// shared pieces a policy may use, owned by others.
type Env struct {
	Log      *slog.Logger // never nil from New
	Reporter Reporter     // receives the policy's state events; nil reports nothing
	// Store is the shared session store (--session-store redis); nil: a policy that keeps
	// sessions keeps them in this process, SessionTTL and MaxSessions bounding them.
	Store       session.Store
	SessionTTL  time.Duration
	MaxSessions int
	// LoadUnitTokens are the prompt tokens one unit of load is worth (--load-unit-tokens).
	LoadUnitTokens int
	// KVIndex is what the workers' engines report they hold (--kv-events-endpoint); nil: none.
	KVIndex *kvevents.Index
	// Tokenizer gives a request's prompt tokens (Input.PromptTokens) when the workers' KV-cache
	// events are on; nil: none (a policy then decides without tokens).
	Tokenizer Tokenizer
}

// Reporter receives a policy's state events; the router's metrics implement it, so that a policy
// never imports the metrics package.
type Reporter interface {
	// Evicted counts n entries of state dropped, by kind: tree (bytes), session_ttl,
	// session_capacity, worker_removed.
	Evicted(kind string, n int)
}

// Entry registers one policy: its spec for the configuration (name, summary, options) and its
// factory, which gets the options the configuration resolved (of the type Spec.Options returns).
type Entry struct {
	registry.Spec
	New func(env Env, opts registry.Options) Policy
}

var factories sync.Map // name → func(Env, registry.Options) Policy

// Register makes a policy known by name: to the configuration through the registry, and to New.
// Policies call it from their package's init; it panics on a name already taken.
func Register(e Entry) {
	registry.Register(e.Spec)
	factories.Store(e.Name, e.New)
}

// New builds the policy called name from its options (nil: its defaults).
func New(name string, env Env, opts registry.Options) (Policy, error) {
	f, ok := factories.Load(name)
	if !ok {
		return nil, registry.Unknown(name)
	}
	if opts == nil {
		if s, _ := registry.Lookup(name); s.Options != nil {
			opts = s.Options()
		}
	}
	if env.Log == nil {
		env.Log = slog.New(slog.DiscardHandler)
	}
	return f.(func(Env, registry.Options) Policy)(env, opts), nil
}

func init() {
	stateless := func(name, summary string, p func() Policy) {
		Register(Entry{Spec: registry.Spec{Name: name, Summary: summary}, New: func(Env, registry.Options) Policy { return p() }})
	}
	stateless(NameRoundRobin, "each candidate in turn", func() Policy { return &RoundRobin{} })
	stateless(NameRandom, "a candidate uniformly at random", func() Policy { return Random{} })
	stateless(NamePowerOfTwo, "the less loaded of two random candidates", func() Policy { return PowerOfTwo{} })
	stateless(NameConsistentHash, "a hash ring over the session or routing key", func() Policy { return NewConsistentHash() })
	stateless(NameRendezvous, "highest random weight over the session or routing key", func() Policy { return Rendezvous{} })
}
