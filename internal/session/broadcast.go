package session

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"time"
)

// Broadcast bounds: a message over maxBroadcastMessage is not sent, a batch holds at most
// maxBroadcastBatch bytes, and at most broadcastQueue messages wait to be sent (more are dropped).
const (
	maxBroadcastMessage = 16 << 10
	maxBroadcastBatch   = 256 << 10
	broadcastQueue      = 4096
)

// Broadcast carries small messages between the router's replicas through the Redis server's
// publish/subscribe channel, at most once: a message sent while Redis is down, or while a replica
// is cut off, is lost to it. Send never blocks; Run publishes what was sent, in batches, and hands
// every other replica's messages to its receiver.
type Broadcast struct {
	r       *Redis
	channel string
	origin  [8]byte // this replica's mark: its own batches come back and are skipped
	out     chan []byte
}

// Broadcast returns the broadcast on channel name (under the store's key prefix).
func (r *Redis) Broadcast(name string) *Broadcast {
	b := &Broadcast{r: r, channel: r.prefix + "broadcast:" + name, out: make(chan []byte, broadcastQueue)}
	_, _ = rand.Read(b.origin[:])
	return b
}

// Send queues msg for the other replicas; it reports false when msg was dropped (too large, or
// too many waiting). msg is the broadcast's from then on: the caller must not change it.
func (b *Broadcast) Send(msg []byte) bool {
	if len(msg) == 0 || len(msg) > maxBroadcastMessage {
		return false
	}
	select {
	case b.out <- msg:
		return true
	default:
		return false
	}
}

// Run publishes the queued messages and calls receive with every message another replica
// published, one at a time, until ctx ends. It resubscribes after a failure by itself.
func (b *Broadcast) Run(ctx context.Context, receive func([]byte)) {
	sub := b.r.client.Subscribe(ctx, b.channel)
	defer sub.Close()
	go b.publish(ctx)
	in := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-in:
			if !ok {
				return
			}
			b.deliver([]byte(m.Payload), receive)
		}
	}
}

// deliver splits a batch (origin, then each message after its uvarint length) and hands another
// replica's messages to receive; a malformed batch is dropped where it stops making sense.
func (b *Broadcast) deliver(batch []byte, receive func([]byte)) {
	if len(batch) < len(b.origin) || len(batch) > maxBroadcastBatch+maxBroadcastMessage+16 ||
		[8]byte(batch[:8]) == b.origin {
		return
	}
	batch = batch[8:]
	for len(batch) > 0 {
		l, n := binary.Uvarint(batch)
		if n <= 0 || l == 0 || l > maxBroadcastMessage || l > uint64(len(batch)-n) {
			return
		}
		receive(batch[n : n+int(l)])
		batch = batch[n+int(l):]
	}
}

// publish sends the queued messages in batches until ctx ends; a batch that fails is lost.
func (b *Broadcast) publish(ctx context.Context) {
	batch := make([]byte, 0, 4096)
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-b.out:
			batch = append(batch[:0], b.origin[:]...)
		more:
			for {
				batch = binary.AppendUvarint(batch, uint64(len(msg)))
				batch = append(batch, msg...)
				if len(batch) >= maxBroadcastBatch {
					break
				}
				select {
				case msg = <-b.out:
				default:
					break more
				}
			}
			cctx, cancel := context.WithTimeout(ctx, max(b.r.timeout, time.Second))
			_ = b.r.client.Publish(cctx, b.channel, batch).Err()
			cancel()
		}
	}
}
