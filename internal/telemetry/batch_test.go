package telemetry

import (
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestBatcher_ExportsFullBatchesAtOnceAndTheRestWhenFlushed(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	b := newBatcher(exp)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	tr := tp.Tracer("test")
	for range batchSize + 3 {
		_, s := tr.Start(t.Context(), "s")
		s.End()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(exp.GetSpans()) < batchSize {
		if time.Now().After(deadline) {
			t.Fatalf("a full batch was not exported: %d spans", len(exp.GetSpans()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := b.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != batchSize+3 {
		t.Fatalf("%d spans exported, want %d", n, batchSize+3)
	}
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestBatcher_DropsRatherThanGrowsPastItsQueue(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	b := newBatcher(exp)
	b.maxQueue = 10
	close(b.stop) // no exporting goroutine: spans only queue
	<-b.done
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))
	tr := tp.Tracer("test")
	for range 15 {
		_, s := tr.Start(t.Context(), "s")
		s.End()
	}
	b.mu.Lock()
	queued, dropped := len(b.spans), b.dropped
	b.mu.Unlock()
	if queued != 10 || dropped != 5 {
		t.Fatalf("queued %d, dropped %d; want 10 and 5", queued, dropped)
	}
	if err := b.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 10 {
		t.Fatalf("flushed %d spans, want 10", n)
	}
}
