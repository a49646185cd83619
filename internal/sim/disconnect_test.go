package sim

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// send posts a chat request with ctx in the background and reports its error.
func send(ctx context.Context, url, content string) <-chan error {
	errc := make(chan error, 1)
	go func() {
		body := `{"messages":[{"role":"user","content":"` + content + `"}],"max_tokens":4,"ignore_eos":true}`
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	return errc
}

func TestDisconnect_FreesSlotAndPinnedBlocks(t *testing.T) {
	cfg, clock := clockedConfig()
	cfg.MaxNumSeqs = 1
	fleet, err := StartLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	w, url := fleet.Workers()[0], fleet.URLs()[0]

	ctxA, cancelA := context.WithCancel(context.Background())
	errA := send(ctxA, url, words("a", 2000))
	testkit.WaitFor(t, "A in prefill", func() bool { return clock.Sleepers() == 1 })
	if w.Stats().PinnedBlocks == 0 {
		t.Fatal("a running request pins no blocks")
	}
	ctxB, cancelB := context.WithCancel(context.Background())
	errB := send(ctxB, url, words("b", 100))
	ctxC, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	errC := send(ctxC, url, words("c", 100))
	testkit.WaitFor(t, "B and C waiting", func() bool { return w.Stats().Waiting == 2 })

	cancelB() // a waiting client leaves: it leaves the queue
	testkit.WaitFor(t, "B out of the queue", func() bool { return w.Stats().Waiting == 1 })

	cancelA() // the running client leaves: slot and blocks go to C at once
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v", err)
	}
	<-errB
	testkit.WaitFor(t, "C running", func() bool { s := w.Stats(); return s.Running == 1 && s.Waiting == 0 && clock.Sleepers() == 1 })
	clock.Advance(time.Hour)
	for range 4 {
		testkit.WaitFor(t, "C to sleep or finish", func() bool { return clock.Sleepers() == 1 || w.Stats().Completed == 1 })
		clock.Advance(time.Hour)
	}
	if err := <-errC; err != nil {
		t.Fatalf("C: %v", err)
	}
	s := w.Stats()
	if s.Running != 0 || s.Waiting != 0 || s.PinnedBlocks != 0 || s.Canceled != 2 || s.Completed != 1 {
		t.Fatalf("after disconnects: %+v", s)
	}
	if s.CachedBlocks == 0 || s.CachedBlocks > 12 {
		// C's prompt and reply are cached; A's unfinished prefill left nothing.
		t.Fatalf("%d cached blocks, want only C's few", s.CachedBlocks)
	}
}
