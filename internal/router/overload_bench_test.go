package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// The overload benchmarks put a real router on loopback in front of olWorkers simulated workers
// of bounded capacity and drive it open loop: requests are issued on a fixed schedule, each on its
// own goroutine, whatever happened to the ones before, so that a slow router cannot slow its own
// load down. Every request is a streamed chat completion; TTFT is the time from sending it to
// reading its first content chunk, and a refusal's answer time is the time to its 429 headers.
//
// Capacity. Each worker runs at most olSeqs requests at once (the sim's max-num-seqs) and queues
// the rest in its own FIFO. A request costs olPrefill (no per-token prefill, so the prompt's
// cache hits change nothing) plus (max_tokens − 1) × olITL of decode; max_tokens is drawn
// uniformly from olMinTokens..olMaxTokens (mean 16, with ignore_eos, so the output is exactly
// that long). Mean service time: 50 ms + 15 × 10 ms = 200 ms, so a running slot completes 5
// requests/s, a worker 20 and the fleet of 4 workers 80 requests/s (olCapacity). The output
// lengths vary so that completions do not fall into lockstep, as they would with one fixed
// length after a burst.
//
// Run them on a quiet machine, one at a time:
//
//	go test ./internal/router/ -run '^$' -bench 'Overload|Fairness' -benchtime=1x -count=3
const (
	olWorkers   = 4
	olSeqs      = 4
	olPrefill   = 50 * time.Millisecond
	olITL       = 10 * time.Millisecond
	olMinTokens = 6
	olMaxTokens = 26
	olModel     = "sim-model"
)

// olService is the mean service time of one request on a running slot.
const olService = olPrefill + (olMinTokens+olMaxTokens)/2*olITL - olITL

// olCapacity is the fleet's throughput in requests/s once every slot is busy.
var olCapacity = float64(olWorkers*olSeqs) / olService.Seconds()

// olRig is a router built from a configuration, serving on loopback in front of a fleet of
// bounded simulated workers, with an HTTP client for the load.
type olRig struct {
	r      *Router
	url    string
	fleet  *sim.Fleet
	client *http.Client

	mu       sync.Mutex
	simQueue []time.Duration // queue time inside the sims of requests that waited there
	simRuns  int             // requests the sims finished
}

func startOLRig(b *testing.B, cfg config.Config) *olRig {
	b.Helper()
	simCfg := sim.DefaultConfig()
	simCfg.Models = []string{olModel}
	simCfg.MaxNumSeqs = olSeqs
	simCfg.PrefillOverhead = olPrefill
	simCfg.PrefillTimePerToken = 0
	simCfg.InterTokenLatency = olITL
	simCfg.TimeScale = 1
	fleet, err := sim.StartLocal(olWorkers, simCfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fleet.Close) // after the router has stopped: cleanups run last first
	rig := &olRig{fleet: fleet}
	for _, w := range fleet.Workers() {
		w.OnResult(func(res sim.Result) {
			rig.mu.Lock()
			rig.simRuns++
			if res.Queued {
				rig.simQueue = append(rig.simQueue, res.QueueTime)
			}
			rig.mu.Unlock()
		})
	}

	cfg.Policy = "cache_aware" // the router's default: a new conversation goes to the least loaded worker
	cfg.WorkerURLs = fleet.URLs()
	r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	r.Start(b.Context()) // health probes, and the admission queue's periodic wake-up
	rig.r = r
	rig.url = serveForBench(b, r)
	for _, w := range r.Pool().All() {
		if !w.Healthy() {
			b.Fatalf("worker %s is not healthy", w.Name())
		}
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true, IdleConnTimeout: time.Minute}
	b.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

// olStream is one open-loop source: n requests at rate per second, the first after delay,
// authenticated with key when set.
type olStream struct {
	rate  float64
	n     int
	delay time.Duration
	key   string
	seed  uint64
}

// olShot is what the client saw of one request.
type olShot struct {
	status   int
	late     time.Duration // how far behind its schedule the request was sent
	header   time.Duration // to the response headers: the whole answer of a refusal
	ttft     time.Duration // to the first content chunk, for 200
	complete bool          // a 200 stream that ended with [DONE]
	code     string        // the error code of a refusal
	err      error
}

// lost reports a request that was neither served in full nor refused with 429.
func (s olShot) lost() bool {
	return s.err != nil || (s.status != http.StatusOK && s.status != http.StatusTooManyRequests) ||
		(s.status == http.StatusOK && !s.complete)
}

// run drives the streams concurrently and returns each one's shots once every request is over.
// While it runs it samples the workers' in-flight loads every millisecond; peak is the highest
// load any one worker had.
func (rig *olRig) run(b *testing.B, streams ...olStream) (shots [][]olShot, peak int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	shots = make([][]olShot, len(streams))
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	for si, st := range streams {
		shots[si] = make([]olShot, st.n)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(st.seed, uint64(si)))
			interval := time.Duration(float64(time.Second) / st.rate)
			var reqs sync.WaitGroup
			for i := range st.n {
				at := start.Add(st.delay + time.Duration(i)*interval)
				time.Sleep(time.Until(at))
				body := olBody(st.seed, i, olMinTokens+rng.IntN(olMaxTokens-olMinTokens+1))
				reqs.Go(func() { shots[si][i] = rig.shoot(ctx, body, st.key, at) })
			}
			reqs.Wait()
		})
	}
	stop := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		var top int64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			for _, w := range rig.r.Pool().All() {
				top = max(top, w.Load())
			}
			select {
			case <-stop:
				sampled <- top
				return
			case <-t.C:
			}
		}
	}()
	wg.Wait()
	close(stop)
	return shots, <-sampled
}

// olBody is a streamed chat request of exactly tokens output tokens whose text no other request
// of the run shares, so that every request is a new conversation for the policy.
func olBody(seed uint64, i, tokens int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": olModel,
		"messages": []map[string]string{{"role": "user",
			"content": fmt.Sprintf("Ticket %d-%d: summarise the incident report in one line.", seed, i)}},
		"max_tokens": tokens,
		"ignore_eos": true,
		"stream":     true,
	})
	return b
}

func (rig *olRig) shoot(ctx context.Context, body []byte, key string, scheduled time.Time) (s olShot) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rig.url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return olShot{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	start := time.Now()
	s.late = start.Sub(scheduled)
	resp, err := rig.client.Do(req)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	s.header = time.Since(start)
	s.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = json.Unmarshal(raw, &e)
		s.code = e.Error.Code
		return s
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			s.complete = true
			break
		}
		if s.ttft == 0 && hasContent(data) {
			s.ttft = time.Since(start)
		}
	}
	if err := sc.Err(); err != nil {
		s.err = err
	}
	return s
}

// hasContent reports whether an SSE chat chunk carries generated text.
func hasContent(data []byte) bool {
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" {
			return true
		}
	}
	return false
}

// olSummary condenses the shots of one stream.
type olSummary struct {
	ok, rejected, lost        int
	ttft, header, reject, lag []time.Duration // ttft and header of 200s, answer time of 429s
	codes                     map[string]int
}

func summarize(shots []olShot) olSummary {
	s := olSummary{codes: map[string]int{}}
	for _, sh := range shots {
		s.lag = append(s.lag, sh.late)
		switch {
		case sh.lost():
			s.lost++
		case sh.status == http.StatusOK:
			s.ok++
			s.ttft = append(s.ttft, sh.ttft)
			s.header = append(s.header, sh.header)
		default:
			s.rejected++
			s.reject = append(s.reject, sh.header)
			s.codes[sh.code]++
		}
	}
	return s
}

// pct is the nearest-rank q-quantile of ds in milliseconds; NaN for none.
func pct(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return ms(s[max(i, 0)])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// takeSimQueue returns and forgets the sims' record since the last call: how many requests they
// finished and the queue times of those that waited for a running slot.
func (rig *olRig) takeSimQueue() (runs int, queued []time.Duration) {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	runs, queued = rig.simRuns, rig.simQueue
	rig.simRuns, rig.simQueue = 0, nil
	return runs, queued
}

// settle waits for the router's load counters and the admission controller to come back to
// 0 after a run and fails the benchmark if they do not within 5 s. A stream's [DONE] can reach
// the client a moment before the router closes its attempt.
func (rig *olRig) settle(b *testing.B) (load int64, inflight, queued int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		load = 0
		for _, w := range rig.r.Pool().All() {
			load += w.Load()
		}
		if c := rig.r.admission.Controller; c != nil {
			inflight, queued = c.InFlight(), c.Queued()
		}
		if load == 0 && inflight == 0 && queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("after the run: worker load %d, admission in flight %d, queued %d; want all 0", load, inflight, queued)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkOverload offers 3× the fleet's capacity through a router whose admission control is
// set to that capacity, after measuring the unloaded TTFT at 0.5× capacity on the same router.
// The queue is small: it holds one request per worker for at most 40 ms, less than one prefill,
// so a request that would wait longer than it then takes to start is refused at once instead.
// Two ways of stating the capacity are measured: per worker (--max-inflight-per-worker = the
// sims' max-num-seqs) and router-wide (--max-concurrent-requests = all their slots).
func BenchmarkOverload(b *testing.B) {
	const (
		queueSize    = olWorkers
		queueTimeout = 0.04 // seconds
		unloadedFor  = 5 * time.Second
		overloadFor  = 10 * time.Second
	)
	modes := []struct {
		name string
		set  func(*config.Config)
	}{
		{"max_inflight_per_worker", func(c *config.Config) { c.MaxInflightPerWorker = olSeqs }},
		{"max_concurrent_requests", func(c *config.Config) { c.MaxConcurrentRequests = olWorkers * olSeqs }},
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			for range b.N {
				cfg := testConfig()
				mode.set(&cfg)
				cfg.QueueSize = queueSize
				cfg.QueueTimeoutSecs = queueTimeout
				rig := startOLRig(b, cfg)

				low := olStream{rate: 0.5 * olCapacity, seed: 1}
				low.n = int(low.rate * unloadedFor.Seconds())
				lowShots, lowPeak := rig.run(b, low)
				base := summarize(lowShots[0])
				baseRuns, baseSimQ := rig.takeSimQueue()
				if base.lost > 0 || base.rejected > 0 {
					b.Fatalf("unloaded phase: %d lost, %d refused (codes %v)", base.lost, base.rejected, base.codes)
				}
				rig.settle(b)

				high := olStream{rate: 3 * olCapacity, seed: 2}
				high.n = int(high.rate * overloadFor.Seconds())
				rejBefore := rejections(rig.r)
				highShots, peak := rig.run(b, high)
				over := summarize(highShots[0])
				runs, simQ := rig.takeSimQueue()
				load, inflight, queued := rig.settle(b)
				rej := rejections(rig.r)

				unloadedP99, acceptedP99 := pct(base.ttft, 0.99), pct(over.ttft, 0.99)
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(unloadedP99, "unloaded-ttft-p99-ms")
				b.ReportMetric(acceptedP99, "accepted-ttft-p99-ms")
				b.ReportMetric(acceptedP99/unloadedP99, "ttft-ratio")
				b.ReportMetric(pct(over.reject, 0.99), "reject-p99-ms")
				b.ReportMetric(float64(over.lost), "lost")
				b.ReportMetric(float64(over.ok)/overloadFor.Seconds(), "served-req/s") // per second of offered load
				b.ReportMetric(100*float64(over.rejected)/float64(high.n), "refused-%")
				b.ReportMetric(float64(peak), "peak-worker-load")
				b.ReportMetric(100*float64(len(simQ))/float64(max(runs, 1)), "sim-queued-%")
				b.ReportMetric(float64(load+int64(inflight+queued)), "counters-after")
				b.Logf("capacity %.0f req/s; unloaded %.0f req/s × %d: TTFT p50 %.1f p99 %.1f ms, peak worker load %d, %d/%d waited in a sim (p99 %.1f ms)",
					olCapacity, low.rate, low.n, pct(base.ttft, 0.5), unloadedP99, lowPeak, len(baseSimQ), baseRuns, pct(baseSimQ, 0.99))
				b.Logf("overload %.0f req/s × %d: served %d, refused %d (%v; router: queue_full %.0f, queue_timeout %.0f), lost %d",
					high.rate, high.n, over.ok, over.rejected, over.codes, rej[0]-rejBefore[0], rej[1]-rejBefore[1], over.lost)
				b.Logf("  accepted TTFT p50 %.1f p90 %.1f p99 %.1f max %.1f ms; to headers p50 %.1f p99 %.1f ms; refusals p50 %.2f p99 %.2f max %.1f ms",
					pct(over.ttft, 0.5), pct(over.ttft, 0.9), acceptedP99, pct(over.ttft, 1), pct(over.header, 0.5), pct(over.header, 0.99),
					pct(over.reject, 0.5), pct(over.reject, 0.99), pct(over.reject, 1))
				b.Logf("  peak worker load %d (limit %d per worker, %d slots); %d/%d requests waited in a sim's queue (p99 %.1f ms); send lag p99 %.2f ms; after: load %d, in flight %d, queued %d",
					peak, olSeqs, olWorkers*olSeqs, len(simQ), runs, pct(simQ, 0.99), pct(over.lag, 0.99), load, inflight, queued)
				if over.lost > 0 {
					b.Errorf("%d requests lost (neither 200 nor 429)", over.lost)
				}
			}
		})
	}
}

// rejections returns the router's admission_rejections_total for queue_full and queue_timeout.
func rejections(r *Router) [2]float64 {
	var out [2]float64
	for i, reason := range []string{"queue_full", "queue_timeout"} {
		var m dto.Metric
		if err := r.Metrics().AdmissionRejections.WithLabelValues(reason).Write(&m); err == nil {
			out[i] = m.GetCounter().GetValue()
		}
	}
	return out
}

// admissionWait reads the router's admission_wait_seconds of one priority: its count and sum.
func admissionWait(b *testing.B, r *Router, priority string) (count uint64, sum float64) {
	b.Helper()
	var m dto.Metric
	obs := r.Metrics().AdmissionWait.WithLabelValues(priority)
	if err := obs.(interface{ Write(*dto.Metric) error }).Write(&m); err != nil {
		b.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// BenchmarkFairness runs two tenants through one router: batch (priority batch) offering 5× the
// fleet's capacity and interactive (priority interactive) at 10% of it. The router admits as many
// requests as the fleet has slots (--max-concurrent-requests 16) and queues up to 64 (0.8 s of the
// fleet's work) for at most 2 s. The interactive tenant is first run alone on the same router for
// its baseline; in the contended run it starts 1 s after the batch flood, once the queue is full.
//
// Queue wait is measured at the client as the time to the response headers of a served request:
// the sim sends its headers as soon as it receives a request, before it schedules it, and the
// router relays them at once, so that time is the admission wait plus the router's and the
// sim's overhead (the alone run shows that overhead: a few milliseconds at p99). The router's own
// admission_wait_seconds is per priority, hence here per tenant; its buckets are too coarse for a
// p99, so its mean over the contended run is reported beside the client's figures.
func BenchmarkFairness(b *testing.B) {
	// Without a reserve the interactive tenant waits, at the head of the queue, for the next
	// request to end; with --priority-reserve 2 it finds a place kept for it.
	for _, reserve := range []int{0, 2} {
		b.Run(fmt.Sprintf("priority_reserve=%d", reserve), func(b *testing.B) { benchFairness(b, reserve) })
	}
}

func benchFairness(b *testing.B, reserve int) {
	const (
		aloneFor     = 10 * time.Second
		contendedFor = 15 * time.Second
		lead         = time.Second
	)
	for range b.N {
		cfg := testConfig()
		cfg.ClientAPIKeysFile = clientKeysFile(b, "sk-batch tenant=batch priority=batch\nsk-inter tenant=inter priority=interactive\n")
		cfg.PriorityLevels = []string{"interactive", "default", "batch"}
		cfg.MaxConcurrentRequests = olWorkers * olSeqs
		cfg.QueueSize = 64
		cfg.QueueTimeoutSecs = 2
		cfg.PriorityReserve = reserve
		rig := startOLRig(b, cfg)

		inter := olStream{rate: 0.1 * olCapacity, key: "sk-inter", seed: 3}
		inter.n = int(inter.rate * aloneFor.Seconds())
		aloneShots, _ := rig.run(b, inter)
		alone := summarize(aloneShots[0])
		if alone.lost > 0 || alone.rejected > 0 {
			b.Fatalf("interactive alone: %d lost, %d refused (codes %v)", alone.lost, alone.rejected, alone.codes)
		}
		rig.settle(b)
		rig.takeSimQueue()

		batch := olStream{rate: 5 * olCapacity, key: "sk-batch", seed: 4}
		batch.n = int(batch.rate * (lead + contendedFor).Seconds())
		inter.delay, inter.seed = lead, 5
		inter.n = int(inter.rate * contendedFor.Seconds())
		ic0, is0 := admissionWait(b, rig.r, "interactive")
		bc0, bs0 := admissionWait(b, rig.r, "batch")
		shots, peak := rig.run(b, batch, inter)
		bs, is := summarize(shots[0]), summarize(shots[1])
		runs, simQ := rig.takeSimQueue()
		load, inflight, queued := rig.settle(b)
		ic1, is1 := admissionWait(b, rig.r, "interactive")
		bc1, bs1 := admissionWait(b, rig.r, "batch")

		interWait, batchWait := pct(is.header, 0.99), pct(bs.header, 0.99)
		aloneTTFT, interTTFT := pct(alone.ttft, 0.99), pct(is.ttft, 0.99)
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(interWait, "inter-wait-p99-ms")
		b.ReportMetric(batchWait, "batch-wait-p99-ms")
		b.ReportMetric(interWait/batchWait, "wait-ratio")
		b.ReportMetric(aloneTTFT, "inter-alone-ttft-p99-ms")
		b.ReportMetric(interTTFT, "inter-ttft-p99-ms")
		b.ReportMetric(interTTFT/aloneTTFT, "inter-ttft-ratio")
		b.ReportMetric(pct(bs.ttft, 0.99), "batch-ttft-p99-ms")
		b.ReportMetric(float64(bs.lost+is.lost), "lost")
		b.ReportMetric(float64(is.rejected), "inter-refused")
		b.ReportMetric(float64(load+int64(inflight+queued)), "counters-after")
		b.Logf("capacity %.0f req/s; interactive alone %.0f req/s × %d: TTFT p50 %.1f p99 %.1f ms, to headers p99 %.2f ms",
			olCapacity, inter.rate, len(aloneShots[0]), pct(alone.ttft, 0.5), aloneTTFT, pct(alone.header, 0.99))
		b.Logf("contended: batch %.0f req/s × %d: served %d, refused %d %v, lost %d; wait p50 %.1f p99 %.1f ms, TTFT p99 %.1f ms, refusals p99 %.1f ms",
			batch.rate, batch.n, bs.ok, bs.rejected, bs.codes, bs.lost, pct(bs.header, 0.5), batchWait, pct(bs.ttft, 0.99), pct(bs.reject, 0.99))
		b.Logf("  interactive %.0f req/s × %d from +%v: served %d, refused %d %v, lost %d; wait p50 %.1f p99 %.1f max %.1f ms, TTFT p50 %.1f p99 %.1f max %.1f ms",
			inter.rate, inter.n, lead, is.ok, is.rejected, is.codes, is.lost, pct(is.header, 0.5), interWait, pct(is.header, 1),
			pct(is.ttft, 0.5), interTTFT, pct(is.ttft, 1))
		b.Logf("  router admission_wait_seconds mean: interactive %.1f ms over %d, batch %.1f ms over %d; peak worker load %d; %d/%d waited in a sim (p99 %.1f ms); after: load %d, in flight %d, queued %d",
			1000*(is1-is0)/float64(max(ic1-ic0, 1)), ic1-ic0, 1000*(bs1-bs0)/float64(max(bc1-bc0, 1)), bc1-bc0,
			peak, len(simQ), runs, pct(simQ, 0.99), load, inflight, queued)
		if bs.lost+is.lost > 0 {
			b.Errorf("%d requests lost (neither 200 nor 429)", bs.lost+is.lost)
		}
	}
}
