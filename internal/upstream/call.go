package upstream

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Peer is the worker a call goes to, as the call sees it: told of every byte of an answer read
// (Progressed), and asked while the call waits for a first byte whether it was found stalled.
// *workers.Worker is one.
type Peer interface {
	Progressed()
	Stalled() bool
}

// Call is one request to a worker on the connections of a Pool: its deadlines, its worker, and
// the connection it is on, which another goroutine may cut at any moment (a client that went
// away). A Call may carry one request after another (the attempts of one routed request); its
// fields are set before each Send and read by it only.
type Call struct {
	// Peer is the worker the request goes to.
	Peer Peer
	// Deadline bounds the whole call: writing the request and reading the answer, its body
	// included. HeadersBy bounds the wait for the answer's headers; never after Deadline.
	Deadline, HeadersBy time.Time
	// CheckStall ends the wait for the first byte of the answer as soon as Peer is found stalled:
	// nothing of the answer came, so another worker may take the request.
	CheckStall bool

	conn atomic.Pointer[Conn] // the connection in use, for Cut to close
	cut  atomic.Bool
}

// Cut closes the connection the call is on, and any it takes from now on: the request ends at
// once, and a worker whose connection closed stops generating. Safe from any goroutine.
func (call *Call) Cut() {
	call.cut.Store(true)
	if c := call.conn.Load(); c != nil {
		c.Close()
	}
}

// IsCut reports whether Cut was called.
func (call *Call) IsCut() bool { return call.cut.Load() }

// StallPoll is how often a call waiting for its answer's first byte looks whether its worker was
// found stalled (Call.CheckStall).
const StallPoll = 250 * time.Millisecond

// errStalled ends a call whose worker was found stalled before any byte of its answer came.
var errStalled = errors.New("the worker was found stalled")

// errCut ends a call that was cut before it could use its connection.
var errCut = errors.New("the call was cut")

// Send writes out on a connection of the pool and reads the answer's headers. It returns the
// answer, with its body still to be read from the connection (end it with Finish), or how the
// call failed.
//
// A pooled connection that turns out to have been closed by the worker (it never read the
// request) is replaced at once by a new one, and the request sent again; the re-send dials
// rather than taking the next pooled connection: a worker that closes its keep-alive
// connections after each answer, or at a short idle timeout, leaves the pool full of connections
// that die in the same way, and a re-send that picked them could fail again and again. A new
// connection is never stale, so there is at most one re-send.
func (p *Pool) Send(out *fasthttp.Request, call *Call) (*fasthttp.Response, *Conn, Failure) {
	for fresh := false; ; fresh = true {
		resp, c, err := p.exchange(out, call, fresh)
		if err == nil {
			return resp, c, Failure{}
		}
		if errors.Is(err, errCut) {
			return nil, nil, Failure{Message: err.Error()}
		}
		f := classify(err, c, !time.Now().Before(call.Deadline))
		if !f.stale || fresh || call.IsCut() {
			return nil, nil, f
		}
		if p.opts.Resent != nil {
			p.opts.Resent(f)
		}
	}
}

// exchange writes out on a connection from the pool (a new one when fresh) and reads the answer's
// headers by call.HeadersBy; once they came, the connection's reads are bounded by call.Deadline.
func (p *Pool) exchange(out *fasthttp.Request, call *Call, fresh bool) (*fasthttp.Response, *Conn, error) {
	get := p.get
	if fresh {
		get = p.dial
	}
	c, err := get()
	if err != nil {
		return nil, nil, err
	}
	c.peer = call.Peer
	call.conn.Store(c)
	if call.IsCut() { // Cut ran before it could see this connection
		call.conn.Store(nil)
		c.Close()
		return nil, c, errCut
	}
	fail := func(err error) (*fasthttp.Response, *Conn, error) {
		call.conn.Store(nil)
		c.Close()
		return nil, c, err
	}
	_ = c.conn.SetWriteDeadline(call.Deadline)
	if err := out.Write(c.bw); err != nil {
		c.writeFailed = true
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		c.writeFailed = true
		return fail(err)
	}
	c.wrote = true
	if call.CheckStall {
		if err := c.waitFirstByte(call.Peer, call.HeadersBy); err != nil {
			return fail(err)
		}
	}
	_ = c.conn.SetReadDeadline(call.HeadersBy)
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	resp.SkipBody = out.Header.IsHead() // an answer to HEAD has headers only, whatever its Content-Length
	if err := resp.Read(c.br); err != nil {
		fasthttp.ReleaseResponse(resp)
		return fail(err)
	}
	_ = c.conn.SetReadDeadline(call.Deadline)
	return resp, c, nil
}

// waitFirstByte waits until the first byte of the answer is there to read, or deadline passes,
// or w is found stalled. It reads in StallPoll rounds: a read that times out takes no byte, and
// the next round reads on.
func (c *Conn) waitFirstByte(w Peer, deadline time.Time) error {
	for {
		round := time.Now().Add(StallPoll)
		if deadline.Before(round) {
			round = deadline
		}
		_ = c.conn.SetReadDeadline(round)
		_, err := c.br.Peek(1)
		switch {
		case err == nil:
			return nil
		case !IsTimeout(err) || !time.Now().Before(deadline):
			return err
		case w.Stalled():
			return errStalled
		}
	}
}

// Finish ends the call's answer resp on c: the connection goes back to the pool when whole says
// its answer was read to the end and neither the answer nor a Cut closes it, and is closed
// otherwise (which is how a worker learns to stop generating for a client that left). resp is
// released. It reports whether the connection went back to the pool.
func (call *Call) Finish(c *Conn, resp *fasthttp.Response, whole bool) bool {
	call.conn.Store(nil)
	keep := whole && !resp.ConnectionClose() && !call.IsCut()
	fasthttp.ReleaseResponse(resp)
	if keep {
		c.pool.put(c)
	} else {
		c.Close()
	}
	return keep
}
