package telemetry

import (
	"context"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// batcher is a span processor that gathers ended spans under a mutex and wakes its exporting
// goroutine only when a batch is full or the batch interval passed. The SDK's batch processor
// hands every span over a channel, waking its goroutine per span; on a request path that ends
// three spans per request that wake-up is most of tracing's cost.
type batcher struct {
	exp      sdktrace.SpanExporter
	mu       sync.Mutex
	spans    []sdktrace.ReadOnlySpan
	full     chan struct{} // a batch is ready: wake the exporter
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	dropped  int
	maxQueue int
}

const (
	batchSize     = 512
	batchInterval = 2 * time.Second
	batchQueue    = 8192 // spans waiting at most; more are dropped rather than held
)

func newBatcher(exp sdktrace.SpanExporter) *batcher {
	b := &batcher{exp: exp, full: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), maxQueue: batchQueue}
	go b.run()
	return b
}

func (b *batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	if len(b.spans) >= b.maxQueue {
		b.dropped++
		b.mu.Unlock()
		return
	}
	b.spans = append(b.spans, s)
	ready := len(b.spans) == batchSize
	b.mu.Unlock()
	if ready {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
}

func (b *batcher) take() []sdktrace.ReadOnlySpan {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.spans
	b.spans = make([]sdktrace.ReadOnlySpan, 0, batchSize)
	return out
}

func (b *batcher) export(ctx context.Context) error {
	for {
		spans := b.take()
		if len(spans) == 0 {
			return nil
		}
		for len(spans) > 0 {
			n := min(len(spans), batchSize)
			if err := b.exp.ExportSpans(ctx, spans[:n]); err != nil {
				return err
			}
			spans = spans[n:]
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (b *batcher) run() {
	defer close(b.done)
	tick := time.NewTicker(batchInterval)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-b.full:
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = b.export(ctx) // a collector that is down loses these spans; the next batch tries again
		cancel()
	}
}

// ForceFlush exports what is queued now.
func (b *batcher) ForceFlush(ctx context.Context) error { return b.export(ctx) }

// Shutdown stops the exporting goroutine, exports what is queued and shuts the exporter down.
func (b *batcher) Shutdown(ctx context.Context) error {
	b.once.Do(func() { close(b.stop) })
	<-b.done
	err := b.export(ctx)
	if e := b.exp.Shutdown(ctx); err == nil {
		err = e
	}
	return err
}
