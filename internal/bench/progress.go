package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Progress reports a run as it goes: a bar redrawn in place on a terminal, plain periodic lines
// otherwise (logs, CI). A nil *Progress reports nothing.
type Progress struct {
	w        io.Writer
	tty      bool
	interval time.Duration

	label                      string
	total                      int
	done, errs, prompt, cached atomic.Int64

	stopc chan struct{}
	wg    sync.WaitGroup
}

// NewProgress writes to w; tty selects the redrawn bar. Plain lines come every 5 seconds.
func NewProgress(w io.Writer, tty bool) *Progress {
	iv := 5 * time.Second
	if tty {
		iv = 200 * time.Millisecond
	}
	return &Progress{w: w, tty: tty, interval: iv}
}

// IsTerminal reports whether f is a character device (a terminal), without any dependency.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// begin starts reporting a run of total requests.
func (p *Progress) begin(label string, total int) {
	if p == nil {
		return
	}
	p.label, p.total = label, total
	p.done.Store(0)
	p.errs.Store(0)
	p.prompt.Store(0)
	p.cached.Store(0)
	p.stopc = make(chan struct{})
	p.wg.Go(func() {
		tick := time.NewTicker(p.interval)
		defer tick.Stop()
		for {
			select {
			case <-p.stopc:
				return
			case <-tick.C:
				p.print(false)
			}
		}
	})
}

// end stops reporting and prints the final state.
func (p *Progress) end() {
	if p == nil || p.stopc == nil {
		return
	}
	close(p.stopc)
	p.wg.Wait()
	p.stopc = nil
	p.print(true)
}

// add counts one finished request.
func (p *Progress) add(r *Record) {
	if p == nil {
		return
	}
	p.done.Add(1)
	if r.Err != "" {
		p.errs.Add(1)
	}
	p.prompt.Add(int64(r.PromptTokens))
	p.cached.Add(int64(r.CachedTokens))
}

func (p *Progress) print(final bool) {
	done, errs := p.done.Load(), p.errs.Load()
	hit := 0.0
	if pr := p.prompt.Load(); pr > 0 {
		hit = float64(p.cached.Load()) / float64(pr)
	}
	status := fmt.Sprintf("%d/%d requests  %d errors  hit rate %.1f%%", done, p.total, errs, 100*hit)
	if !p.tty {
		fmt.Fprintf(p.w, "%s: %s\n", p.label, status)
		return
	}
	const width = 24
	filled := 0
	if p.total > 0 {
		filled = min(width, int(done)*width/p.total)
	}
	bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r\x1b[K%-28s [%s] %s%s", p.label, bar, status, end)
}
