package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/metrics"
)

// bodies.go reads request bodies, and bounds the memory they hold: all requests together
// (--max-request-body-bytes-total) and one client's requests together
// (--max-request-body-bytes-per-client).
//
// The router reads every body itself (fasthttp streams it), into memory of the body's own
// (bodyArea), and counts the bytes as they arrive rather than as the headers announce them: a
// client that trickles a body holds what it sent, not the --max-payload-size a chunked body may
// grow to. Each read is counted before it is made, and a read that would take the total or the
// client's share over its bound ends the request: 503 request_bodies_over_budget (429
// request_bodies_over_client_budget for the share; 529 and 429 on the Anthropic routes), with
// Retry-After, and the connection closed. A body whose announced length cannot fit in what is
// left right now is refused at once, before any of it is read; a body that needs room under the
// total while it arrives takes it from the bodies that started after it (makeRoom).
//
// A body's count covers its bytes and one copy of them: routing derives its history key from the
// body (reqkey), which is as long as the conversation in it, and the admin endpoints copy their
// bodies (plain.go). While the body arrives both are counted; once a routed request is parsed,
// the copy's count becomes the length of what was derived (nothing for the load-only routes). So
// the bytes counted are the bytes held, and the router's memory follows the bound: the pieces not
// counted are each connection's 16 KiB read buffer, the first 8 KiB of a body (read ahead with
// its headers), and the copies made with --vllm-pd-disaggregation (the decode leg's body) and
// KV-cache events (the /tokenize query), which docs/configuration.md names. The copies are heap
// memory, and a collection is started once enough of them were given back (gaveBack).
//
// The bytes of a request are given back once, when both its handler has returned and its
// exchange has ended (for a streamed answer, when the stream does); a request that could not be
// read gives them back at once.

// bodyBudget counts the bytes the bodies of the requests in flight hold.
type bodyBudget struct {
	total     int64 // all requests together; 0: no bound
	perClient int64 // one client's requests together; 0: no bound

	mu      sync.Mutex
	held    int64
	clients map[string]int64 // the clients holding bytes; one leaves with its last byte
	// reading are the bodies still arriving, oldest first. A body short of room under the total
	// takes it from younger ones (makeRoom): when more bodies arrive at once than the total
	// holds, the first ones finish and the last ones are refused, rather than all of them filling
	// the budget halfway and most being refused near their end.
	reading []*heldBody

	freed      atomic.Int64 // heap bytes of bodies and copies given back since the last collection
	collecting atomic.Bool
}

// overBudget says which bound a count would pass.
type overBudget uint8

const (
	withinBudget overBudget = iota
	overTotal
	overClientShare
)

func newBodyBudget(total, perClient int64) *bodyBudget {
	return &bodyBudget{total: total, perClient: perClient, clients: map[string]int64{}}
}

// check reports the bound that n more bytes of client would pass; b.mu must be held.
func (b *bodyBudget) check(client string, n int64) overBudget {
	switch {
	case b.perClient > 0 && b.clients[client]+n > b.perClient:
		return overClientShare
	case b.total > 0 && b.held+n > b.total:
		return overTotal
	}
	return withinBudget
}

// fits reports the bound that n more bytes of client would pass now, counting nothing.
func (b *bodyBudget) fits(client string, n int64) overBudget {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.check(client, n)
}

// count sets h's count to area and copied bytes, taking or giving back the difference. A count
// that would grow past a bound is refused, unless force, or unless younger bodies make room for
// it under the total (makeRoom); a body that made room for an older one is refused from then on.
func (b *bodyBudget) count(h *heldBody, area, copied int64, force bool) overBudget {
	b.mu.Lock()
	defer b.mu.Unlock()
	more := area + copied - h.areaBytes - h.copyBytes
	if more > 0 && !force {
		if h.cut {
			return overTotal
		}
		if over := b.check(h.client, more); over != withinBudget && (over == overClientShare || !b.makeRoom(h, more)) {
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
	return withinBudget
}

// makeRoom cuts the bodies still arriving that started after h, the youngest first, until what
// they hold leaves room for more bytes of h under the total, and reports whether it does; it
// cuts none when all of them together would not. A cut body's read ends at once (unblock), and
// its bytes are given back moments later, when its request is answered: until then the total may
// be passed by what they hold. b.mu must be held.
func (b *bodyBudget) makeRoom(h *heldBody, more int64) bool {
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
func (b *bodyBudget) arriving(h *heldBody) {
	b.mu.Lock()
	b.reading = append(b.reading, h)
	b.mu.Unlock()
}

// arrived takes h off the bodies still arriving; it reports whether h was cut meanwhile.
func (b *bodyBudget) arrived(h *heldBody) (cut bool) {
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
func (b *bodyBudget) gaveBack(heap int64) {
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
func (b *bodyBudget) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// heldBody is one request's body and its count in the budget.
type heldBody struct {
	budget *bodyBudget
	client string
	area   bodyArea
	bytes  []byte // the body received: the area's first bytes
	// What the request counts (budget.mu): the memory of its area, and the copy routing makes of
	// it; and whether, while it arrived, it was cut to make room for an older body.
	areaBytes, copyBytes int64
	cut                  bool
	unblock              func() // ends a read waiting for the client's bytes; nil: none can wait
	// owners are the handler and, while it runs, the exchange: the last to let go gives the
	// count back and frees the area.
	owners atomic.Int32
}

// emptyBody is the body of a request that sent none: it counts and holds nothing.
func emptyBody(b *bodyBudget) *heldBody {
	h := &heldBody{budget: b}
	h.owners.Store(1)
	return h
}

// count sets the request's count (bodyBudget.count).
func (h *heldBody) count(area, copied int64, force bool) overBudget {
	return h.budget.count(h, area, copied, force)
}

// derived sets the copy's count to n, the bytes routing derived from the body; it may grow past
// a bound by what the derivation took beyond the body's own length, which was counted ahead.
func (h *heldBody) derived(n int) {
	h.budget.mu.Lock()
	area := h.areaBytes
	h.budget.mu.Unlock()
	h.count(area, int64(n), true)
}

// hold adds an owner: the exchange, until its end.
func (h *heldBody) hold() { h.owners.Add(1) }

// release lets go of the body; the last owner gives its count back and frees its memory, after
// which nothing may read the body.
func (h *heldBody) release() {
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
	h.area.free()
	h.budget.gaveBack(heap)
}

// bodyReadStep bounds one read of a body: the count runs ahead of the bytes received by at most
// one read, and a read is never longer than what came so far (at least a page), so a client
// that trickles holds about twice what it sent.
const bodyReadStep = 64 << 10

// bodyError is why a body could not be read, with the answer it gets.
type bodyError struct {
	status int
	code   string
	msg    string
	over   overBudget
}

func (e *bodyError) Error() string { return e.msg }

var (
	errBodyTooLarge = errors.New("body too large")
	errBodyCut      = errors.New("the request body ended before its announced length")
)

// receive reads the request's body into memory of its own, counted in the budget as it arrives
// (see the top of this file). client is who sends it (clientName). On failure it returns the
// error to answer, having given back whatever the body counted.
func (s *Server) receive(ctx *fasthttp.RequestCtx, client string) (*heldBody, *bodyError) {
	length := ctx.Request.Header.ContentLength() // -1: chunked; -2 (or 0): no body
	if length == 0 || length < -1 {
		return emptyBody(s.bodies), nil
	}
	if int64(length) > s.opts.MaxPayloadSize {
		return nil, tooLarge(s.opts.MaxPayloadSize)
	}
	limit := length
	if length < 0 {
		limit = int(s.opts.MaxPayloadSize)
	}
	if length > 0 {
		if over := s.bodies.fits(client, 2*int64(length)); over != withinBudget {
			return nil, &bodyError{over: over}
		}
	}
	h := &heldBody{budget: s.bodies, client: client, area: newBodyArea(limit),
		unblock: func() { _ = ctx.Conn().SetReadDeadline(time.Now()) }}
	h.owners.Store(1)
	s.bodies.arriving(h)
	err := h.read(ctx.RequestBodyStream(), length, limit)
	if s.bodies.arrived(h) {
		err = &bodyError{over: overTotal} // it made room for an older body
	}
	if err == nil {
		return h, nil
	}
	h.release()
	var be *bodyError
	switch {
	case errors.As(err, &be):
		return nil, be
	case errors.Is(err, errBodyTooLarge):
		return nil, tooLarge(s.opts.MaxPayloadSize)
	case isTimeout(err):
		return nil, &bodyError{status: fasthttp.StatusRequestTimeout, code: "request_timeout", msg: "the request was not received in time"}
	case errors.Is(err, errBodyCut):
		return nil, &bodyError{status: fasthttp.StatusBadRequest, code: "bad_request", msg: errBodyCut.Error()}
	}
	return nil, &bodyError{status: fasthttp.StatusBadRequest, code: "bad_request", msg: "malformed HTTP request"}
}

func tooLarge(limit int64) *bodyError {
	return &bodyError{status: fasthttp.StatusRequestEntityTooLarge, code: "payload_too_large",
		msg: "request body exceeds the limit of " + itoa(limit) + " bytes (--max-payload-size)"}
}

// read reads the body from stream into the area, length bytes (-1: up to the chunked body's
// end, at most limit), counting each read before it is made.
func (h *heldBody) read(stream io.Reader, length, limit int) error {
	if stream == nil {
		return errBodyCut
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
				return errBodyTooLarge
			case err == io.EOF:
				return nil
			case err != nil:
				return err
			}
			continue
		}
		step := min(bodyReadStep, max(n, pageSize), limit-n)
		room := h.area.room(n + step)
		if over := h.count(room, room, false); over != withinBudget {
			return &bodyError{over: over}
		}
		k, err := stream.Read(h.area.b[n : n+step])
		h.bytes = h.area.b[:n+k]
		switch {
		case err == io.EOF:
			if length >= 0 && len(h.bytes) != length {
				return errBodyCut
			}
			room := h.area.room(len(h.bytes))
			h.count(room, room, false) // what came, no longer what might have
			return nil
		case err != nil:
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return errBodyCut
			}
			return err
		}
	}
}

// answerBodyError answers a request whose body could not be read, in its route's shape, and
// closes the connection: what is left of the body is not read.
func (s *Server) answerBodyError(ctx *fasthttp.RequestCtx, rt *route, e *bodyError) {
	shape := openAIErrors
	if rt != nil {
		shape = rt.errors
	}
	var status int
	switch e.over {
	case overTotal:
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
		status = writeFastError(ctx, shape, fasthttp.StatusServiceUnavailable, "server_error", "request_bodies_over_budget",
			"the router holds as many request bodies as it may at once (--max-request-body-bytes-total); try again shortly")
	case overClientShare:
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
		status = writeFastError(ctx, shape, fasthttp.StatusTooManyRequests, "rate_limit_error", "request_bodies_over_client_budget",
			"this client's requests hold as many body bytes as one client may at once (--max-request-body-bytes-per-client); try again shortly")
	default:
		status = writeFastError(ctx, shape, e.status, "invalid_request_error", e.code, e.msg)
	}
	ctx.SetConnectionClose()
	if rt != nil {
		rt.count(ctx.Time(), metrics.StatusClass(status), time.Now())
	}
}

// clientName is who a request comes from, for the bounds each client has (its share of the body
// budget, its searches): its key's tenant when client keys are checked and it presented a valid
// one, else its address (an IPv4 address, or the IPv6 /64 a host is usually given, as
// --max-connections-per-client counts them).
func clientName(tenant string, addr net.IP) string {
	if tenant != "" {
		return "tenant:" + tenant
	}
	ip, ok := netip.AddrFromSlice(addr)
	if !ok {
		return "addr:"
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return "addr:" + p.String()
	}
	return "addr:" + ip.String()
}

// bodyClient names the client of a request whose body is about to be read: by its client key's
// tenant when keys are checked and the key is valid, else by its address.
func (s *Server) bodyClient(ctx *fasthttp.RequestCtx) string {
	var tenant string
	if s.opts.ClientKeys != nil {
		key := clientkeys.FromHeaders(func(name string) string { return string(ctx.Request.Header.Peek(name)) })
		if c, ok := s.opts.ClientKeys.Lookup(key); ok {
			tenant = c.Tenant
		}
	}
	return clientName(tenant, ctx.RemoteIP())
}

// bodyArea is the memory one body is read into, at most limit bytes.
type bodyArea struct {
	b      []byte // the room made so far; for a mapping, all of it
	limit  int
	mapped bool // b is a mapping of its own (bodyarea_linux.go), not heap memory
}

// smallBody is the largest body read into heap memory made for it whole, at once.
const smallBody = 64 << 10

// heapArea is room on the heap for a body of at most limit bytes: made whole at once for a small
// body, else grown by doubling as the body arrives.
func heapArea(limit int) bodyArea {
	return bodyArea{b: make([]byte, min(limit, smallBody)), limit: limit}
}

// room makes room for n bytes and returns the memory the area then takes: for a mapping, the
// pages the first n bytes touch; on the heap, its buffer's size.
func (a *bodyArea) room(n int) int64 {
	if a.mapped {
		return int64(min((n+pageSize-1)/pageSize*pageSize, len(a.b)))
	}
	if n > len(a.b) {
		grown := make([]byte, min(a.limit, max(n, 2*len(a.b))))
		copy(grown, a.b)
		a.b = grown
	}
	return int64(len(a.b))
}
