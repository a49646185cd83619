package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/go-zeromq/zmq4"
)

// bound.go reads the event streams of publishers that dial the router (simulators, sidecars, a
// vLLM whose endpoint names the router): one SUB socket bound at one endpoint, every worker's
// messages arriving on it, told apart by their topic frame. A topic names a worker either through
// an explicit map (vLLM's topic is configurable and empty by default) or, without an entry, in
// llm-d's form kv@HOST:PORT@MODEL, naming the fleet's worker whose URL has that host:port. Each
// worker's messages then go through that worker's own Subscriber sequence handling (duplicates,
// gaps, replays, restarts), exactly as a dialled stream's do. A message whose topic names no
// worker is counted and dropped; nothing is kept per unknown topic.

// BoundWorker is one worker whose publisher dials the bound endpoint.
type BoundWorker struct {
	Source            // Worker, Model and Replay; Endpoint and Topic are not used
	Topics   []string // topics that name this worker explicitly
	HostPort string   // the worker URL's host:port, which an llm-d topic kv@HOST:PORT@MODEL names
}

// Bound is one SUB socket bound at an endpoint that publishers dial, feeding each worker's
// messages, by topic, to that worker's Subscriber.
type Bound struct {
	endpoint string
	index    *Index
	log      *slog.Logger

	// UnknownTopics counts messages whose topic named no worker.
	UnknownTopics atomic.Int64
	// Drops count the connections closed for breaking a bound, the replays of its workers' included.
	Drops PeerDrops
	// connLimit is the most connections the endpoint holds open at once (boundConnections).
	connLimit atomic.Int64

	// apply is held while a message is applied and while a worker is removed, so that a removed
	// worker's blocks are forgotten after its last message, never before.
	apply sync.Mutex

	mu         sync.Mutex
	workers    map[tenant.ID]*boundSub
	byTopic    map[string]*boundSub
	byHostPort map[string]*boundSub
}

type boundSub struct {
	w   BoundWorker
	sub *Subscriber
}

// NewBound returns a reader of the endpoint (tcp://HOST:PORT) into index; Listen binds it.
func NewBound(endpoint string, index *Index, log *slog.Logger) *Bound {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bound{endpoint: endpoint, index: index, log: log, workers: map[tenant.ID]*boundSub{},
		byTopic: map[string]*boundSub{}, byHostPort: map[string]*boundSub{}}
	b.connLimit.Store(boundConnections(0))
	return b
}

// boundConnections is the most connections the bound endpoint holds open for the workers'
// publishers: each holds one, two for a moment while it dials again before the router has seen
// its old connection end, and a few more are allowed for publishers of workers the fleet does not
// have yet (one refused dials again: ZMQ publishers do). Each connection may hold a message of up
// to MaxMessageBytes, so these are what a peer can make the endpoint hold.
func boundConnections(workers int) int64 { return int64(2*workers + 4) }

// Endpoint is where the socket is bound.
func (b *Bound) Endpoint() string { return b.endpoint }

// Listen binds the socket and reads it until ctx ends, in the background; it returns the bind's
// error, if any.
func (b *Bound) Listen(ctx context.Context) error {
	// No automatic reconnect: zmq4 makes a listening socket that reconnects dial its own endpoint.
	// zmq4 logs each connection whose handshake failed; those are the router's debug lines.
	g := &guard{drops: &b.Drops, limit: func() int { return int(b.connLimit.Load()) }}
	sub := zmq4.NewSub(guarded(ctx, g), zmq4.WithLogger(slog.NewLogLogger(b.log.Handler(), slog.LevelDebug)))
	if err := sub.Listen(bounded(b.endpoint)); err != nil {
		sub.Close()
		return err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		sub.Close()
		return err
	}
	go func() {
		defer sub.Close()
		for {
			msg, err := sub.Recv()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				// One publisher's connection ended (it went away, or broke a bound); zmq4 reports it
				// here, and the others' messages go on.
				b.log.Debug("kv events: a connection to the bound endpoint ended", "endpoint", b.endpoint, "error", err)
				continue
			}
			b.receive(ctx, msg.Frames)
		}
	}()
	return nil
}

// receive hands one message to the subscriber its topic names.
func (b *Bound) receive(ctx context.Context, frames [][]byte) {
	if len(frames) == 0 {
		b.UnknownTopics.Add(1)
		return
	}
	b.apply.Lock()
	defer b.apply.Unlock()
	s := b.lookup(frames[0])
	if s == nil {
		b.UnknownTopics.Add(1)
		return
	}
	s.receive(ctx, frames)
}

// lookup is the subscriber of the worker topic names: the explicit map's first, else llm-d's form.
func (b *Bound) lookup(topic []byte) *Subscriber {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.byTopic[string(topic)]; ok {
		return s.sub
	}
	if hp, ok := LLMDTopicHostPort(string(topic)); ok {
		if s, ok := b.byHostPort[hp]; ok {
			return s.sub
		}
	}
	return nil
}

// LLMDTopicHostPort is the host:port an llm-d topic kv@HOST:PORT@MODEL names (the host in the
// form net.JoinHostPort writes), and whether topic has that form.
func LLMDTopicHostPort(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return "", false
	}
	i := strings.Index(rest, "@") // a host:port holds no @; a model name may
	if i < 0 {
		return "", false
	}
	host, port, err := net.SplitHostPort(rest[:i])
	if err != nil || host == "" || port == "" {
		return "", false
	}
	return net.JoinHostPort(host, port), true
}

// Sync makes the workers read from the socket exactly want: a new worker (or one whose entry
// changed) gets a new subscriber, and a worker no longer wanted is dropped and its blocks
// forgotten.
func (b *Bound) Sync(want []BoundWorker) {
	b.apply.Lock()
	defer b.apply.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	wanted := make(map[tenant.ID]BoundWorker, len(want))
	for _, w := range want {
		wanted[w.Worker] = w
	}
	for name, s := range b.workers {
		if w, ok := wanted[name]; !ok || !sameBound(w, s.w) {
			delete(b.workers, name)
			b.index.Forget(name)
		}
	}
	for name, w := range wanted {
		if _, ok := b.workers[name]; !ok {
			s := &boundSub{w: w, sub: NewSubscriber(w.Source, b.index, b.log)}
			s.sub.drops = &b.Drops
			b.workers[name] = s
			b.log.Info("kv events: reading from the bound endpoint", "worker", name, "endpoint", b.endpoint, "topics", w.Topics)
		}
	}
	b.connLimit.Store(boundConnections(len(b.workers)))
	clear(b.byTopic)
	clear(b.byHostPort)
	for _, s := range b.workers {
		for _, t := range s.w.Topics {
			b.byTopic[t] = s
		}
		if s.w.HostPort != "" {
			b.byHostPort[s.w.HostPort] = s
		}
	}
}

func sameBound(a, b BoundWorker) bool {
	if a.Source != b.Source || a.HostPort != b.HostPort || len(a.Topics) != len(b.Topics) {
		return false
	}
	for i := range a.Topics {
		if a.Topics[i] != b.Topics[i] {
			return false
		}
	}
	return true
}

// Status reports every worker read from the socket, by worker.
func (b *Bound) Status() []Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Status, 0, len(b.workers))
	for name, s := range b.workers {
		out = append(out, s.sub.status(name, b.endpoint, b.index))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// CheckBind reports why endpoint cannot be bound for publishers to dial: it must be
// tcp://HOST:PORT with a port of its own (not 0, which no publisher could be told).
func CheckBind(endpoint string) error {
	if strings.Contains(endpoint, HostPlaceholder) {
		return fmt.Errorf("kv events bind endpoint %q: %s has no meaning here; give the address to bind", endpoint, HostPlaceholder)
	}
	if _, err := Endpoint(endpoint, "", 0); err != nil {
		return err
	}
	return nil
}

// Bindable reports whether endpoint's address can be bound now, so that a router told to bind an
// address another process holds, or one of no interface of this host, stops at once with the
// reason instead of running without the streams it was told to read.
func Bindable(endpoint string) error {
	hostPort, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return fmt.Errorf("kv events bind endpoint %q: want tcp://HOST:PORT", endpoint)
	}
	ln, err := net.Listen("tcp", hostPort)
	if err != nil {
		return err
	}
	return ln.Close()
}
