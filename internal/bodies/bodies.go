// Package bodies reads request bodies, and bounds the memory they hold: all requests together
// (--max-request-body-bytes-total) and one client's requests together
// (--max-request-body-bytes-per-client). It is the proxy's memory accounting, apart from HTTP: the
// proxy names the client, hands over the body's stream, and answers what Read refuses.
//
// The router reads every body itself (fasthttp streams it), into memory of the body's own (an
// area), and counts the bytes as they arrive rather than as the headers announce them: a client
// that trickles a body holds what it sent, not the --max-payload-size a chunked body may grow
// to. Each read is counted before it is made, and a read that would take the total or the
// client's share over its bound ends the read (an *OverError: the proxy answers 503
// request_bodies_over_budget, or 429 request_bodies_over_client_budget for the share, and closes
// the connection). A body whose announced length cannot fit in what is left right now is refused
// at once, before any of it is read (Budget.Fits); a body that needs room under the total while
// it arrives takes it from the bodies that started after it (makeRoom).
//
// A body's count covers its bytes and one copy of them: routing derives its history key from the
// body (package protocol), which is as long as the conversation in it, and the admin endpoints copy their bodies.
// While the body arrives both are counted; once a routed request is parsed, the copy's count
// becomes the length of what was derived (Body.Derived; nothing for the load-only routes). So the
// bytes counted are the bytes held, and the router's memory follows the bound: the pieces not
// counted are each connection's 16 KiB read buffer, the first 8 KiB of a body (read ahead with
// its headers), the mappings kept for the next bodies (area_linux.go: 32 MiB at most), and the
// copies made with --vllm-pd-disaggregation (the decode leg's body) and KV-cache events (the
// /tokenize query), which docs/configuration.md names. The copy of a body read into a mapping is
// written after it in the mapping (Scratch); the other copies are heap memory, and a collection
// is started once enough of them were given back (gaveBack).
//
// The bytes of a request are given back once every owner let go of its body (Body.Hold,
// Body.Release): for the proxy, once both its handler has returned and its exchange has ended
// (for a streamed answer, when the stream does); a body that could not be read gives them back
// at once.
package bodies

import (
	"errors"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Budget counts the bytes the bodies of the requests in flight hold.
type Budget struct {
	total     int64 // all requests together; 0: no bound
	perClient int64 // one client's requests together; 0: no bound

	mu      sync.Mutex
	held    int64
	clients map[string]int64 // the clients holding bytes; one leaves with its last byte
	// reading are the bodies still arriving, oldest first. A body short of room under the total
	// takes it from younger ones (makeRoom): when more bodies arrive at once than the total
	// holds, the first ones finish and the last ones are refused, rather than all of them filling
	// the budget halfway and most being refused near their end.
	reading []*Body

	freed      atomic.Int64 // heap bytes of bodies and copies given back since the last collection
	collecting atomic.Bool

	spares spares // the memory of bodies given back, kept for the next ones (area_linux.go)
}

// Over says which bound a count would pass.
type Over uint8

const (
	Within          Over = iota
	OverTotal            // all requests' bodies together
	OverClientShare      // one client's
)

// NewBudget bounds the bodies of all requests together to total bytes, and one client's to
// perClient; 0 bounds none.
func NewBudget(total, perClient int64) *Budget {
	return &Budget{total: total, perClient: perClient, clients: map[string]int64{}}
}

// check reports the bound that n more bytes of client would pass; b.mu must be held.
func (b *Budget) check(client string, n int64) Over {
	switch {
	case b.perClient > 0 && b.clients[client]+n > b.perClient:
		return OverClientShare
	case b.total > 0 && b.held+n > b.total:
		return OverTotal
	}
	return Within
}

// Fits reports the bound that n more bytes of client would pass now, counting nothing.
func (b *Budget) Fits(client string, n int64) Over {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.check(client, n)
}

// count sets h's count to area and copied bytes, taking or giving back the difference. A count
// that would grow past a bound is refused, unless force, or unless younger bodies make room for
// it under the total (makeRoom); a body that made room for an older one is refused from then on.
func (b *Budget) count(h *Body, area, copied int64, force bool) Over {
	b.mu.Lock()
	defer b.mu.Unlock()
	more := area + copied - h.areaBytes - h.copyBytes
	if more > 0 && !force {
		if h.cut {
			return OverTotal
		}
		if over := b.check(h.client, more); over != Within && (over == OverClientShare || !b.makeRoom(h, more)) {
			return over
		}
	}
	b.held += more
	if left := b.clients[h.client] + more; left > 0 {
		b.clients[h.client] = left
	} else {
		delete(b.clients, h.client)
	}
	h.areaBytes, h.copyBytes = area, copied
	return Within
}

// makeRoom cuts the bodies still arriving that started after h, the youngest first, until what
// they hold leaves room for more bytes of h under the total, and reports whether it does; it
// cuts none when all of them together would not. A cut body's read ends at once (unblock), and
// its bytes are given back moments later, when its request is answered: until then the total may
// be passed by what they hold. b.mu must be held.
func (b *Budget) makeRoom(h *Body, more int64) bool {
	at := slices.Index(b.reading, h)
	if at < 0 {
		return false
	}
	younger := b.reading[at+1:]
	need, could := b.held+more-b.total, int64(0)
	for _, v := range younger {
		if v.cut {
			need -= v.areaBytes + v.copyBytes // on its way out already
		} else {
			could += v.areaBytes + v.copyBytes
		}
	}
	if need > could {
		return false
	}
	for i := len(younger) - 1; i >= 0 && need > 0; i-- {
		if v := younger[i]; !v.cut {
			v.cut = true
			if v.unblock != nil {
				v.unblock()
			}
			need -= v.areaBytes + v.copyBytes
		}
	}
	return true
}

// arriving enters h among the bodies still arriving, as the youngest.
func (b *Budget) arriving(h *Body) {
	b.mu.Lock()
	b.reading = append(b.reading, h)
	b.mu.Unlock()
}

// arrived takes h off the bodies still arriving; it reports whether h was cut meanwhile.
func (b *Budget) arrived(h *Body) (cut bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.reading, h); i >= 0 {
		b.reading = slices.Delete(b.reading, i, i+1)
	}
	return h.cut
}

// collectAfter is the heap bytes of bodies and their copies given back, as a share of the total,
// after which a garbage collection is started: Go's collector otherwise lets the heap grow to
// twice what was live at its last run before it runs again, and with bodies arriving wave after
// wave the copies of the last wave would still be held, uncollected, beside the next.
const collectAfter = 8 // an eighth of the total

// gaveBack is told the heap bytes a request's body and copies held, once given back; past
// collectAfter it starts a collection (one at a time) on a goroutine of its own.
func (b *Budget) gaveBack(heap int64) {
	if b.total == 0 || b.freed.Add(heap) < b.total/collectAfter || !b.collecting.CompareAndSwap(false, true) {
		return
	}
	b.freed.Store(0)
	go func() {
		runtime.GC()
		b.collecting.Store(false)
	}()
}

// Held is the bytes counted now, all requests together.
func (b *Budget) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// Body is one request's body and its count in the budget.
type Body struct {
	budget *Budget
	client string
	area   bodyArea
	bytes  []byte // the body received: the area's first bytes
	// What the request counts (budget.mu): the memory of its area, and the copy routing makes of
	// it; and whether, while it arrived, it was cut to make room for an older body.
	areaBytes, copyBytes int64
	cut                  bool
	unblock              func() // ends a read waiting for the client's bytes; nil: none can wait
	// owners are the holders of the body (Hold, Release): the last to let go gives the count back
	// and frees the area.
	owners atomic.Int32
}

// Empty is the body of a request that sent none: it counts and holds nothing.
func (b *Budget) Empty() *Body {
	h := &Body{budget: b}
	h.owners.Store(1)
	return h
}

// count sets the request's count (Budget.count).
func (h *Body) count(area, copied int64, force bool) Over {
	return h.budget.count(h, area, copied, force)
}

// Bytes is the body received; nothing may read it once the body is released.
func (h *Body) Bytes() []byte { return h.bytes }

// Derived sets the copy's count to n, the bytes routing derived from the body; it may grow past
// a bound by what the derivation took beyond the body's own length, which was counted ahead.
func (h *Body) Derived(n int) {
	h.budget.mu.Lock()
	area := h.areaBytes
	h.budget.mu.Unlock()
	h.count(area, int64(n), true)
}

// derivedRoom is how many times a body's size a mapped area has after the body for Scratch: twice
// the body, the bound under which package protocol writes a history key in one pass.
const derivedRoom = 2

// Scratch returns empty memory with room for n bytes that lives as long as the body, for what
// routing derives from it (the history key, counted by Derived): a body read into a mapping has
// the room after its bytes, so a large request's key costs no new heap memory, and the pages it
// takes are kept with the mapping for the next body. A body on the heap, or an n that does not
// fit, gets heap memory. What is written there may not be read once the body is released.
func (h *Body) Scratch(n int) []byte {
	a := &h.area
	start := (len(h.bytes) + 63) &^ 63
	switch {
	case a.kept != nil && start+n <= len(*a.kept):
		return (*a.kept)[start : start : start+n]
	case a.mapped && start <= len(a.b) && n <= len(a.b)-start:
		a.backed = max(a.backed, min((start+n+pageSize-1)/pageSize*pageSize, len(a.b)))
		return a.b[start : start : start+n]
	}
	return make([]byte, 0, n)
}

// Hold adds an owner (the proxy's exchange, until its end).
func (h *Body) Hold() { h.owners.Add(1) }

// Release lets go of the body; the last owner gives its count back and frees its memory, after
// which nothing may read the body.
func (h *Body) Release() {
	if h.owners.Add(-1) != 0 {
		return
	}
	h.budget.mu.Lock()
	heap := h.copyBytes
	if !h.area.mapped {
		heap += h.areaBytes
	}
	h.budget.mu.Unlock()
	h.count(0, 0, false)
	h.bytes = nil
	h.area.giveKept()
	h.budget.spares.give(&h.area)
	h.budget.gaveBack(heap)
}

// bodyReadStep bounds one read of a body: the count runs ahead of the bytes received by at most
// one read, and a read is never longer than what came so far (at least a page), so a client
// that trickles holds about twice what it sent.
const bodyReadStep = 64 << 10

// OverError is a read that would have passed a bound: the body was not read.
type OverError struct{ Over Over }

func (e *OverError) Error() string {
	if e.Over == OverClientShare {
		return "the client's request bodies are over their share"
	}
	return "the request bodies are over the budget"
}

// Errors of Read besides *OverError and the stream's own.
var (
	ErrTooLarge = errors.New("body too large")
	ErrCut      = errors.New("the request body ended before its announced length")
)

// Read reads the body client sends on stream into memory of its own, counted in the budget as it
// arrives: length bytes, or for -1 up to the chunked body's end, at most limit. unblock, when set,
// ends a read of stream waiting for the client's bytes (when the body is cut to make room for an
// older one). On failure Read returns the error (an *OverError, ErrTooLarge, ErrCut, or the
// stream's), having given back whatever the body counted.
func (b *Budget) Read(stream io.Reader, client string, length, limit int, unblock func()) (*Body, error) {
	h := &Body{budget: b, client: client, area: b.spares.take(limit), unblock: unblock}
	h.owners.Store(1)
	b.arriving(h)
	err := h.read(stream, length, limit)
	if b.arrived(h) {
		err = &OverError{OverTotal} // it made room for an older body
	}
	if err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

// read reads the body from stream into the area, length bytes (-1: up to the chunked body's
// end, at most limit), counting each read before it is made.
func (h *Body) read(stream io.Reader, length, limit int) error {
	if stream == nil {
		return ErrCut
	}
	for {
		n := len(h.bytes)
		if n == limit {
			if length >= 0 {
				return nil
			}
			var probe [1]byte // a chunked body at the limit: one byte more is too large
			k, err := stream.Read(probe[:])
			switch {
			case k > 0:
				return ErrTooLarge
			case err == io.EOF:
				return nil
			case err != nil:
				return err
			}
			continue
		}
		step := min(bodyReadStep, max(n, pageSize), limit-n)
		room := h.area.room(n + step)
		if over := h.count(room, room, false); over != Within {
			return &OverError{over}
		}
		k, err := stream.Read(h.area.b[n : n+step])
		h.bytes = h.area.b[:n+k]
		switch {
		case err == io.EOF:
			if length >= 0 && len(h.bytes) != length {
				return ErrCut
			}
			room := h.area.room(len(h.bytes))
			h.count(room, room, false) // what came, no longer what might have
			return nil
		case err != nil:
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return ErrCut
			}
			return err
		}
	}
}

// bodyArea is the memory one body is read into, at most limit bytes.
type bodyArea struct {
	b      []byte // the room made so far; for a mapping, all of it
	limit  int
	mapped bool // b is a mapping of its own (area_linux.go), not heap memory
	// kept is the whole buffer of a small body's area, b its first limit bytes (smallAreas).
	kept *[]byte
	// backed are the bytes of a mapping's pages written so far, by this body or an earlier one
	// that had the mapping: the kernel keeps them backed until the mapping goes.
	backed int
}

// smallBody is the largest body read into heap memory made for it whole, at once.
const smallBody = 64 << 10

// heapArea is room on the heap for a body of at most limit bytes: for a small body a buffer kept
// from an earlier one (smallAreas), else made at smallBody and grown by doubling as the body
// arrives.
func heapArea(limit int) bodyArea {
	if limit > smallBody {
		return bodyArea{b: make([]byte, smallBody), limit: limit}
	}
	class := smallClass(limit)
	kept, _ := smallAreas[class].Get().(*[]byte)
	if kept == nil {
		b := make([]byte, (1+derivedRoom)*smallestClass<<class)
		kept = &b
	}
	return bodyArea{b: (*kept)[:limit], limit: limit, kept: kept}
}

// smallAreas keep the heap buffers of small bodies for the next ones, by size class: a buffer of
// class c holds a body of up to smallestClass<<c bytes and, after it, derivedRoom times as much
// for Scratch, as a mapping does; so a small request's body and history key take no new heap
// memory either. The whole buffer is counted as the body's while the body holds it. A collection
// empties them. Making a body's buffer anew per request, and its key's, was a seventh of the
// router's CPU per request at 4 KiB (docs/performance.md).
var smallAreas [smallClasses]sync.Pool

const (
	smallestClass = 4 << 10
	smallClasses  = 5 // 4, 8, 16, 32 and 64 KiB: smallestClass<<(smallClasses-1) == smallBody
)

// smallClass is the class of the buffers that hold a body of limit bytes, at most smallBody.
func smallClass(limit int) int {
	c := 0
	for smallestClass<<c < limit {
		c++
	}
	return c
}

// giveKept puts a small body's buffer back for the next one.
func (a *bodyArea) giveKept() {
	if a.kept != nil {
		poisonArea(*a.kept)
		smallAreas[smallClass(a.limit)].Put(a.kept)
		a.kept = nil
	}
}

// room makes room for n bytes and returns the memory the area then takes: for a mapping, the
// pages the first n bytes touch; on the heap, its buffer's size.
func (a *bodyArea) room(n int) int64 {
	if a.mapped {
		pages := min((n+pageSize-1)/pageSize*pageSize, len(a.b))
		a.backed = max(a.backed, pages)
		return int64(pages)
	}
	if a.kept != nil {
		return int64(len(*a.kept))
	}
	if n > len(a.b) {
		grown := make([]byte, min(a.limit, max(n, 2*len(a.b))))
		copy(grown, a.b)
		a.b = grown
	}
	return int64(len(a.b))
}

// poisonArea overwrites a released small body's buffer in the poison build (poison.go).
var poisonArea = func([]byte) {}
