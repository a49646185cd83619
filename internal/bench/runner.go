package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Target is one endpoint the workload runs against.
type Target struct {
	Name string
	// URLs are the base URLs; with more than one, requests are spread over them round-robin,
	// so the turns of one session may reach different replicas.
	URLs []string
	// SessionMode is SessionHeader, SessionBody or SessionNone.
	SessionMode string
	// Policy is the router policy when the bench started the router itself; empty otherwise.
	Policy string
	// RouterArgs are the router flags the bench's own routers ran with (--router-arg).
	RouterArgs []string
	// Replicas is the number of in-process routers behind URLs, 0 for an external target, and
	// SessionStore their session store (memory, or redis when they share it).
	Replicas     int
	SessionStore string
	// Loads returns the requests in flight on each worker behind the target; nil when unknown.
	Loads func() []float64
	// Workers is the number of workers behind the target, when known (0 otherwise).
	Workers int
	// WorkerMetrics are worker base URLs whose /metrics count prefix-cache hits and queries.
	WorkerMetrics []string
	// TimeScale is the simulated workers' time scale (1 for real workers): workload times are
	// multiplied by it and measured times divided by it, so reports read at full scale.
	TimeScale float64
	// KVCapacityTokens is the KV cache of all the workers behind the target, in tokens, when
	// known (the bench's own simulated workers): the denominator of the oversubscription.
	KVCapacityTokens int64
}

// RunOptions are the knobs of one run that do not depend on the target.
type RunOptions struct {
	API         string // one of APIs; "" is chat
	Model       string
	Concurrency int // closed loop: sessions at once; paced: requests at once
	Timeout     time.Duration
	// SampleInterval is the period of load sampling (default 10ms).
	SampleInterval time.Duration
	Progress       *Progress // may be nil
}

// runResult is everything one run measured.
type runResult struct {
	records []Record
	samples []loadSample
	wall    time.Duration
	skipped int   // turns not sent because an earlier turn of their session failed
	failed  error // the run could not start
}

// run replays w against t and returns every request's record. Closed loop: Concurrency workers
// each take the next session and run its turns in order. Paced: every session runs on its own,
// each turn waiting for its time and for the previous turn, with at most Concurrency requests in
// flight. A failed turn ends its session, since the next turn would have to resend its reply.
//
// With a chaining API (responses-chain) each turn after the first names the previous turn's
// response instead of resending the conversation; a turn whose response carries no id ends its
// session, since the next turn could not name it.
func run(ctx context.Context, w *Workload, t *Target, o RunOptions) runResult {
	a, err := apiFor(o.API)
	if err != nil {
		return runResult{failed: err}
	}
	client := newHTTPClient(o.Concurrency, o.Timeout)
	defer client.CloseIdleConnections()
	scale := t.TimeScale
	if scale <= 0 {
		scale = 1
	}
	var (
		rr       atomic.Uint64 // round-robin over t.URLs
		inflight atomic.Int64
		active   atomic.Int64 // closed loop: sessions in progress
		working  atomic.Int64 // Σ the working sets (Turn.Tokens) of the sessions in progress
		skipped  atomic.Int64
		mu       sync.Mutex
		records  = make([]Record, 0, w.Requests())
	)
	began := time.Now()
	steady := func() bool {
		if w.Paced {
			return t.Workers > 0 && inflight.Load() >= int64(t.Workers)
		}
		return active.Load() >= int64(min(o.Concurrency, len(w.Sessions)))
	}
	sampler := startSampler(t.Loads, steady, working.Load, o.SampleInterval)

	sem := make(chan struct{}, max(1, o.Concurrency))
	runSession := func(si int) {
		s := &w.Sessions[si]
		var conv conversation
		sid := ""
		if t.SessionMode != SessionNone {
			sid = s.ID + "@" + t.Name
		}
		tools, terr := a.tools(s.Tools)
		previousID := ""
		var held int64 // this session's part of working
		defer func() { working.Add(-held) }()
		for ti := range s.Turns {
			turn := &s.Turns[ti]
			if turn.Tokens > 0 {
				working.Add(int64(turn.Tokens) - held)
				held = int64(turn.Tokens)
			}
			if w.Paced {
				if !sleepUntil(ctx, began.Add(time.Duration(float64(turn.At)*scale))) {
					skipped.Add(int64(len(s.Turns) - ti))
					return
				}
				sem <- struct{}{}
			} else if turn.Think > 0 && ti > 0 {
				if !sleepUntil(ctx, time.Now().Add(time.Duration(float64(turn.Think)*scale))) {
					skipped.Add(int64(len(s.Turns) - ti))
					return
				}
			}
			msgs, fresh := conv.next(turn)
			x := exchange{model: o.Model, msgs: msgs, fresh: fresh, tools: tools,
				maxTokens: turn.MaxTokens, ignoreEOS: turn.IgnoreEOS, sessionID: sid, mode: t.SessionMode}
			if a.chains() && !turn.Fresh {
				x.previousID = previousID
			}
			rec := Record{Session: si, Turn: ti}
			if terr != nil {
				rec.Err = terr.Error()
			} else {
				url := t.URLs[(rr.Add(1)-1)%uint64(len(t.URLs))]
				inflight.Add(1)
				send(ctx, client, url, a, &x, &rec, began)
				inflight.Add(-1)
			}
			if w.Paced {
				<-sem
			}
			if rec.Err == "" && a.chains() {
				previousID = rec.responseID
				if previousID == "" {
					rec.Err = "no response id in the stream"
				}
			}
			if rec.Err == "" {
				conv.reply(rec.reply, rec.calls)
			}
			rec.reply, rec.responseID, rec.calls = "", "", nil
			mu.Lock()
			records = append(records, rec)
			mu.Unlock()
			o.Progress.add(&rec)
			if rec.Err != "" {
				skipped.Add(int64(len(s.Turns) - ti - 1))
				return
			}
		}
	}

	var wg sync.WaitGroup
	if w.Paced {
		for si := range w.Sessions {
			wg.Go(func() { runSession(si) })
		}
	} else {
		next := make(chan int)
		for range min(o.Concurrency, len(w.Sessions)) {
			wg.Go(func() {
				for si := range next {
					active.Add(1)
					runSession(si)
					active.Add(-1)
				}
			})
		}
	feed:
		for si := range w.Sessions {
			select {
			case next <- si:
			case <-ctx.Done():
				for _, s := range w.Sessions[si:] {
					skipped.Add(int64(len(s.Turns)))
				}
				break feed
			}
		}
		close(next)
	}
	wg.Wait()
	wall := time.Since(began)
	return runResult{records: records, samples: sampler.stop(), wall: wall, skipped: int(skipped.Load())}
}

// sleepUntil waits until deadline or until ctx ends, and reports whether it was the deadline.
func sleepUntil(ctx context.Context, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}
