package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Set runs one Subscriber per worker into one Index. Sync makes the running set the wanted one:
// it starts a subscriber for each new worker (or one whose endpoints changed) and stops, and
// forgets the index of, every worker no longer wanted.
type Set struct {
	index *Index
	log   *slog.Logger

	mu    sync.Mutex
	subs  map[tenant.ID]*running
	bound *Bound    // the publishers that dial the router; nil without --kv-events-bind
	drops PeerDrops // of the dialled streams and their replays
}

type running struct {
	src    Source
	sub    *Subscriber
	cancel context.CancelFunc
	done   chan struct{}
}

// NewSet returns an empty set feeding index.
func NewSet(index *Index, log *slog.Logger) *Set {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Set{index: index, log: log, subs: map[tenant.ID]*running{}}
}

// Bind adds the streams of b, read from the endpoint publishers dial, to the set's Status and
// Close; b's workers follow b.Sync.
func (s *Set) Bind(b *Bound) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bound = b
}

// UnknownTopics counts the messages on the bound endpoint whose topic named no worker.
func (s *Set) UnknownTopics() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bound == nil {
		return 0
	}
	return s.bound.UnknownTopics.Load()
}

// DroppedConnections are the event connections closed for breaking a bound, dialled and bound
// alike, since the set began.
func (s *Set) DroppedConnections() DroppedConnections {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.drops.load()
	if s.bound != nil {
		d = d.plus(s.bound.Drops.load())
	}
	return d
}

// Index is the index the set feeds.
func (s *Set) Index() *Index { return s.index }

// Sync starts and stops subscribers so that exactly the wanted sources run; they stop when ctx
// ends, too.
func (s *Set) Sync(ctx context.Context, want []Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wanted := make(map[tenant.ID]Source, len(want))
	for _, src := range want {
		wanted[src.Worker] = src
	}
	for name, r := range s.subs {
		if src, ok := wanted[name]; !ok || src != r.src {
			s.stop(name, r)
		}
	}
	for name, src := range wanted {
		if _, ok := s.subs[name]; ok {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		r := &running{src: src, sub: NewSubscriber(src, s.index, s.log), cancel: cancel, done: make(chan struct{})}
		r.sub.drops = &s.drops
		s.subs[name] = r
		go func() { defer close(r.done); _ = r.sub.Run(sctx) }()
		s.log.Info("kv events: subscribed", "worker", name, "endpoint", src.Endpoint, "replay", src.Replay != "")
	}
}

// stop ends one subscriber and forgets its worker's blocks; s.mu is held.
func (s *Set) stop(name tenant.ID, r *running) {
	r.cancel()
	<-r.done
	delete(s.subs, name)
	s.index.Forget(name)
}

// Close stops every subscriber.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, r := range s.subs {
		s.stop(name, r)
	}
	if s.bound != nil {
		s.bound.Sync(nil)
	}
}

// Status is one worker's stream and index, for metrics and the status page.
type Status struct {
	Worker                                                                      tenant.ID
	Endpoint, Replay                                                            string // dialled ("" Replay: none)
	Complete                                                                    bool
	Blocks                                                                      int
	LastEvent                                                                   time.Time
	Batches, Events, DecodeErrors, Duplicates, Gaps, Replays, Resyncs, Restarts int64
	Orphans                                                                     int64 // stored blocks not indexed
}

// Status reports every running subscriber, by worker.
func (s *Set) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.subs))
	for name, r := range s.subs {
		out = append(out, r.sub.status(name, r.src.Endpoint, s.index))
	}
	if s.bound != nil {
		out = append(out, s.bound.Status()...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// status is the subscriber's Status as worker name's stream from endpoint.
func (sub *Subscriber) status(name tenant.ID, endpoint string, index *Index) Status {
	st := &sub.Stats
	return Status{
		Worker: name, Endpoint: endpoint, Replay: sub.src.Replay, Complete: sub.Complete(), Blocks: index.Blocks(name), LastEvent: st.LastEvent(),
		Batches: st.Batches.Load(), Events: st.Events.Load(), DecodeErrors: st.DecodeErrors.Load(),
		Duplicates: st.Duplicates.Load(), Gaps: st.Gaps.Load(), Replays: st.Replays.Load(),
		Resyncs: st.Resyncs.Load(), Restarts: st.Restarts.Load(), Orphans: st.Orphans.Load(),
	}
}

// HostPlaceholder is replaced by a worker's host in an endpoint template.
const HostPlaceholder = "{host}"

// Endpoint is a worker's endpoint from template (tcp://{host}:5557): the placeholder replaced by
// host, and the port offset by the worker's data-parallel rank, as each rank's publisher binds
// its own port.
func Endpoint(template, host string, rank int) (string, error) {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	u, err := url.Parse(strings.ReplaceAll(template, HostPlaceholder, host))
	if err != nil || u.Scheme != "tcp" || u.Hostname() == "" || u.Path != "" {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://HOST:PORT (HOST may be %s)", template, HostPlaceholder)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || port < 1 || port+max(rank, 0) > 65535 {
		return "", fmt.Errorf("kv events endpoint %q: no usable port", template)
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port+max(rank, 0))), nil
}

// MaxEndpointLen bounds an endpoint a worker names for itself (an admin request's parameter, a
// pod annotation), so that no caller makes the router hold a long string per worker.
const MaxEndpointLen = 256

// WorkerEndpoints are the endpoints one worker names for itself (the admin API, a pod
// annotation, --kv-events-worker-endpoints), in place of the --kv-events-endpoint template's:
// templates of their own, in which HostPlaceholder stands for the worker URL's host and whose port
// is offset by each tenant's data-parallel rank. The zero value names none.
type WorkerEndpoints struct {
	Events string // the publisher's (PUB) endpoint
	Replay string // its replay (ROUTER) endpoint; "" for none
}

// IsZero reports whether e names no endpoint.
func (e WorkerEndpoints) IsZero() bool { return e == WorkerEndpoints{} }

// Check reports why e cannot be dialled: an endpoint that is not tcp://HOST:PORT, longer than
// MaxEndpointLen, or whose host is a wildcard (tcp://*:5557 is where a publisher binds, not where
// the router can reach it), or a replay endpoint without an events endpoint.
func (e WorkerEndpoints) Check() error {
	if e.Events == "" && e.Replay != "" {
		return fmt.Errorf("kv events replay endpoint %q: needs an events endpoint", truncated(e.Replay))
	}
	for _, ep := range []string{e.Events, e.Replay} {
		if ep == "" {
			continue
		}
		if len(ep) > MaxEndpointLen {
			return fmt.Errorf("kv events endpoint %q: longer than %d bytes", truncated(ep), MaxEndpointLen)
		}
		got, err := Endpoint(ep, "worker", 0)
		if err != nil {
			return err
		}
		u, _ := url.Parse(got) // Endpoint made it
		if ip, err := netip.ParseAddr(u.Hostname()); u.Hostname() == "*" || (err == nil && ip.IsUnspecified()) {
			return fmt.Errorf("kv events endpoint %q: a wildcard is where a publisher binds; give an address the router dials (%s for the worker's own host)", ep, HostPlaceholder)
		}
	}
	return nil
}

// truncated is s cut to a length fit for an error message.
func truncated(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
