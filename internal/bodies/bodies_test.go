package bodies

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// pieces hands its data out at most size bytes per read, and calls seen before each read with
// what it handed out so far.
type pieces struct {
	data []byte
	size int
	sent int
	seen func(sent int)
}

func (p *pieces) Read(b []byte) (int, error) {
	if p.seen != nil {
		p.seen(p.sent)
	}
	if len(p.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(b), p.size, len(p.data))
	copy(b, p.data[:k])
	p.data, p.sent = p.data[k:], p.sent+k
	return k, nil
}

func newHeld(b *Budget, client string, limit int) *Body {
	h := &Body{budget: b, client: client, area: b.spares.take(limit)}
	h.owners.Store(1)
	return h
}

// releaseAll gives back every one of bodies and fails the test unless b then counts nothing: no
// body leaves a byte behind in the budget once released.
func releaseAll(t *testing.T, b *Budget, bodies ...*Body) {
	t.Helper()
	for _, h := range bodies {
		h.Release()
	}
	if held := b.Held(); held != 0 {
		t.Errorf("%d bytes counted after the releases", held)
	}
}

// A body is counted as it arrives: never more than twice a read ahead of what came (the bytes and
// their copy), and once read, twice the pages it touched. Given back, it counts nothing.
func TestBodyRead_CountsTheBytesAsTheyArrive(t *testing.T) {
	b := NewBudget(0, 0)
	data := bytes.Repeat([]byte("0123456789"), 300<<10) // 3 MB
	h := newHeld(b, "a", len(data))
	src := &pieces{data: data, size: 10 << 10, seen: func(sent int) {
		ahead := sent + max(sent, pageSize) + pageSize
		if held := b.Held(); held > int64(2*min(ahead, len(data)+pageSize)) {
			t.Fatalf("%d bytes counted with %d received", held, sent)
		}
	}}
	if err := h.read(src, len(data), len(data)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.bytes, data) {
		t.Fatal("the body read is not the body sent")
	}
	area := h.area.room(len(data)) // the pages the body touched, in a mapping of its own
	if pages := int64((len(data) + pageSize - 1) / pageSize * pageSize); h.area.mapped && area != pages {
		t.Errorf("the body's mapping takes %d bytes, want the %d of the pages it touched", area, pages)
	}
	if held := b.Held(); held != 2*area {
		t.Errorf("%d bytes counted for the whole body, want %d", held, 2*area)
	}
	h.Derived(100)
	if held := b.Held(); held != area+100 {
		t.Errorf("%d bytes counted once the copy is known, want %d", held, area+100)
	}
	releaseAll(t, b, h)
}

// A body that would take its client past its share stops being read there; another client's
// body is counted meanwhile.
func TestBodyRead_StopsAtTheClientsShare(t *testing.T) {
	const share = 1 << 20
	b := NewBudget(0, share)
	h := newHeld(b, "a", 4<<20)
	err := h.read(&pieces{data: make([]byte, 3<<20), size: 64 << 10}, -1, 4<<20)
	var be *OverError
	if !errors.As(err, &be) || be.Over != OverClientShare {
		t.Fatalf("error %v, want the client's share passed", err)
	}
	if len(h.bytes) > share/2 {
		t.Errorf("%d bytes read past a share of %d counted twice", len(h.bytes), share)
	}
	other := newHeld(b, "b", 1<<20)
	if err := other.read(&pieces{data: make([]byte, 256<<10), size: 64 << 10}, 256<<10, 256<<10); err != nil {
		t.Errorf("another client's body: %v", err)
	}
	releaseAll(t, b, h, other)
}

// A chunked body longer than the limit is too large; a body shorter than its announced length is
// cut. Neither keeps a count.
func TestBodyRead_TooLargeAndCutBodiesCountNothing(t *testing.T) {
	b := NewBudget(0, 0)
	h := newHeld(b, "a", 100<<10)
	if err := h.read(&pieces{data: make([]byte, 100<<10+1), size: 4 << 10}, -1, 100<<10); !errors.Is(err, ErrTooLarge) {
		t.Errorf("chunked past the limit: %v, want too large", err)
	}
	h.Release()
	h = newHeld(b, "a", 100<<10)
	if err := h.read(&pieces{data: make([]byte, 50<<10), size: 4 << 10}, 100<<10, 100<<10); !errors.Is(err, ErrCut) {
		t.Errorf("short body: %v, want cut", err)
	}
	releaseAll(t, b, h)
}

// Once the heap bytes given back (copies routing made of bodies) reach an eighth of the total, a
// garbage collection runs: the copies do not wait for the heap to double before they are
// collected.
func TestBodyBudget_CopiesGivenBackAreCollectedInTime(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but the one asked for
	b := NewBudget(8<<20, 0)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	h := newHeld(b, "a", 1<<20)
	if over := h.count(0, 2<<20, false); over != Within {
		t.Fatal("the copy did not fit")
	}
	h.Release()
	testkit.WaitFor(t, "a collection", func() bool {
		var now runtime.MemStats
		runtime.ReadMemStats(&now)
		return now.NumGC > before.NumGC && !b.collecting.Load()
	})
	if b.freed.Load() != 0 {
		t.Errorf("%d bytes still counted as given back after the collection", b.freed.Load())
	}
}

// BenchmarkBodyRead reads bodies the way the router does (counted as they arrive, into memory of
// their own) and gives them back: a small chat body on the heap, and a large one in a mapping.
func BenchmarkBodyRead(b *testing.B) {
	for _, size := range []int{4 << 10, 4 << 20} {
		data := bytes.Repeat([]byte("x"), size)
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			budget := NewBudget(1<<30, 256<<20)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				h := newHeld(budget, "a", size)
				if err := h.read(&pieces{data: data, size: 64 << 10}, size, size); err != nil {
					b.Fatal(err)
				}
				h.Release()
			}
		})
	}
}
