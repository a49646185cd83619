// Package kvtest runs an engine's KV-event publisher as vLLM runs one, on real ZMQ sockets on
// loopback, for the tests of the packages that subscribe to it: a PUB socket sending (topic,
// 8-byte big-endian sequence number, payload), and optionally a ROUTER socket answering replay
// requests from a buffer of every batch sent, then the end marker -1.
package kvtest

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/go-zeromq/zmq4"
)

// Publisher is one engine's publisher; it stops when its test ends.
type Publisher struct {
	t        testing.TB
	pub      zmq4.Socket
	router   zmq4.Socket
	Endpoint string // the PUB socket, tcp://127.0.0.1:port
	Replay   string // the ROUTER socket, or "" without replay
	Topic    string

	mu     sync.Mutex
	buffer map[int64][]byte
	seq    int64
}

// FreeEndpoint is a tcp:// endpoint on a loopback port free when asked.
func FreeEndpoint(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// New binds a publisher on endpoint ("" for a free port), with a replay socket when withReplay.
func New(t testing.TB, endpoint string, withReplay bool) *Publisher {
	t.Helper()
	if endpoint == "" {
		endpoint = FreeEndpoint(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{t: t, pub: zmq4.NewPub(ctx), Endpoint: endpoint, Topic: "kv@test", buffer: map[int64][]byte{}}
	if err := p.pub.Listen(p.Endpoint); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if withReplay {
		p.router, p.Replay = zmq4.NewRouter(ctx), FreeEndpoint(t)
		if err := p.router.Listen(p.Replay); err != nil {
			t.Fatal(err)
		}
		go p.serveReplay(done)
	} else {
		close(done)
	}
	t.Cleanup(func() {
		cancel()
		p.pub.Close()
		if p.router != nil {
			p.router.Close()
		}
		<-done
	})
	return p
}

// serveReplay answers replay requests until the router closes.
func (p *Publisher) serveReplay(done chan struct{}) {
	defer close(done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], int64(binary.BigEndian.Uint64(msg.Frames[2]))
		p.mu.Lock()
		for seq := start; seq < p.seq; seq++ {
			if payload, ok := p.buffer[seq]; ok {
				_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, BigEndian(seq), payload))
			}
		}
		p.mu.Unlock()
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, BigEndian(-1), []byte{}))
	}
}

// BigEndian is seq as the 8-byte frame it travels in.
func BigEndian(seq int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	return b[:]
}

// Send publishes payload under the next sequence number. drop keeps it from the stream (as a
// full high-water mark would) while the replay buffer still has it.
func (p *Publisher) Send(payload []byte, drop bool) {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buffer[seq] = payload
	p.mu.Unlock()
	if !drop {
		p.Resend(seq)
	}
}

// Resend publishes batch seq again (a subscriber that has it takes it for a duplicate).
func (p *Publisher) Resend(seq int64) {
	p.mu.Lock()
	payload := p.buffer[seq]
	p.mu.Unlock()
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.Topic), BigEndian(seq), payload)); err != nil {
		p.t.Fatal(err)
	}
}

// Keep drops all but the last n batches from the replay buffer, as vLLM's buffer (buffer_steps
// long) does on an engine that has published more: a replay then starts after the number asked.
func (p *Publisher) Keep(n int64) {
	p.mu.Lock()
	for seq := range p.buffer {
		if seq < p.seq-n {
			delete(p.buffer, seq)
		}
	}
	p.mu.Unlock()
}

// Restart starts the count again, as a restarted engine's publisher does.
func (p *Publisher) Restart() {
	p.mu.Lock()
	p.seq = 0
	clear(p.buffer)
	p.mu.Unlock()
}
