package tokenize

import (
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
)

// Queries rendered into kept buffers, many at once, each reach the engine whole: no buffer is
// rendered into again while a call still sends it.
func TestConcurrentQueriesEachReachTheEngineWhole(t *testing.T) {
	e := newEngine(t, nil)
	c, ws, _ := fleet(t, Options{}, e.URL)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				// Every prompt is new (nothing from the cache) and of its own length.
				msg := fmt.Sprintf(`{"role":"user","content":"%d-%d %s"}`, g, i, strings.Repeat("x", (g*40+i)*97))
				ts, _ := c.Tokens("/v1/chat/completions", msg, ws, "m", []byte("["+msg+"]"), chat)
				if len(ts) != 1 || ts[0] != crc32.ChecksumIEEE([]byte(msg)) {
					errs <- fmt.Errorf("goroutine %d, prompt %d: tokens %v, want the checksum of its one message", g, i, ts)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// rawQuery renders a body of chat messages as it is, without a copy of its own.
type rawQuery struct{}

func (rawQuery) AppendTokenizeBody(dst, body []byte, model string) ([]byte, bool) {
	dst = append(dst, `{"model":"`+model+`","messages":`...)
	return append(append(dst, body...), '}'), true
}

// The query of a long prompt is rendered into a kept buffer: a call allocates far less than the
// prompt it sends. Without the buffer each call allocates the whole prompt; under the race
// detector a sync.Pool drops a quarter of what it is given, on purpose, so the bound is half the
// prompt per call over many calls rather than next to nothing.
func TestAQueryAllocatesNoCopyOfItsPrompt(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/tokenize":
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"tokens":[1,2,3]}`)
		}
	}))
	t.Cleanup(engine.Close)
	c, ws, _ := fleet(t, Options{}, engine.URL)
	const size = 1 << 20
	body := []byte(`[{"role":"user","content":"` + strings.Repeat("x", size) + `"}]`)
	prompts := 0
	ask := func() {
		prompts++ // a prompt of its own each time: the cache answers none of them
		if ts, _ := c.Tokens("/v1/chat/completions", fmt.Sprint(prompts), ws, "m", body, rawQuery{}); len(ts) != 3 {
			t.Fatalf("tokens %v", ts)
		}
	}
	ask() // the buffer is made
	// A collection empties the pool (a second one frees what it held), which a process allocating
	// as fast as the test's engine and client do would run now and then: none runs while counting.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const calls = 60
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range calls {
		ask()
	}
	runtime.ReadMemStats(&after)
	if perCall := (after.TotalAlloc - before.TotalAlloc) / calls; perCall > size/2 {
		t.Errorf("a call of a %d-byte prompt allocated %d bytes, want at most half the prompt", size, perCall)
	}
}
