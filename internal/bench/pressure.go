package bench

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// pressure.go measures what a run asked of the workers' KV caches: the oversubscription (the
// working sets of the sessions in progress over the fleet's KV capacity), planned before the run
// and achieved during it, and how each worker's sessions came and went.
//
// A session's working set is its latest request's prompt and output tokens (Turn.Tokens): what
// its next turn would find cached if nothing of it were evicted. A session is in progress from
// its first request until its last one ends, think times included.

// Pressure is the achieved oversubscription of one target.
type Pressure struct {
	// KVCapacityTokens is the KV cache of every worker behind the target, in tokens.
	KVCapacityTokens int64 `json:"kv_capacity_tokens"`
	// Mean is Σ working sets of the sessions in progress / KVCapacityTokens, averaged over the
	// steady samples (those taken while the workload kept its full concurrency), and Peak the
	// highest sample.
	Mean float64 `json:"oversubscription_mean"`
	Peak float64 `json:"oversubscription_peak"`
}

// measuredPressure is the oversubscription of samples against capacity; nil when there is no
// capacity, or no steady sample knew a working set.
func measuredPressure(samples []loadSample, capacity int64) *Pressure {
	if capacity <= 0 {
		return nil
	}
	var sum float64
	n := 0
	p := &Pressure{KVCapacityTokens: capacity}
	for _, s := range samples {
		if !s.steady || s.working <= 0 {
			continue
		}
		v := float64(s.working) / float64(capacity)
		sum += v
		p.Peak = math.Max(p.Peak, v)
		n++
	}
	if n == 0 {
		return nil
	}
	p.Mean = sum / float64(n)
	return p
}

// PlannedWorkingSet is the KV that concurrency sessions in progress hold at once, by the
// workload's own figures: min(concurrency, sessions) × the mean working set of the workload's
// requests (each request counting once: a session holds each of its working sets for about one
// request's time). ok is false when the workload does not know its working sets.
func (w *Workload) PlannedWorkingSet(concurrency int) (tokens float64, ok bool) {
	var sum, n float64
	for i := range w.Sessions {
		for _, t := range w.Sessions[i].Turns {
			if t.Tokens <= 0 {
				return 0, false
			}
			sum += float64(t.Tokens)
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return float64(min(concurrency, len(w.Sessions))) * sum / n, true
}

// LargestRequest is the most tokens (prompt and output) one request of the workload holds.
func (w *Workload) LargestRequest() int {
	m := 0
	for i := range w.Sessions {
		for _, t := range w.Sessions[i].Turns {
			m = max(m, t.Tokens)
		}
	}
	return m
}

// KVBlocksFor is the KV cache per worker, in blocks of blockSize tokens, that puts the planned
// working set of concurrency sessions at oversubscription times the capacity of workers workers.
// It fails when the workload does not know its working sets, or when one worker could not hold
// the workload's largest request (vLLM would refuse it as longer than its context).
func (w *Workload) KVBlocksFor(oversubscription float64, concurrency, workers, blockSize int) (int, error) {
	if !(oversubscription > 0) || math.IsInf(oversubscription, 0) {
		return 0, fmt.Errorf("--kv-oversubscription %v must be a positive number", oversubscription)
	}
	ws, ok := w.PlannedWorkingSet(concurrency)
	if !ok {
		return 0, fmt.Errorf("--kv-oversubscription needs a workload that knows its working sets (--workload cctrace), not %s", w.Name)
	}
	blocks := int(math.Ceil(ws / oversubscription / float64(workers) / float64(blockSize)))
	if need := (w.LargestRequest() + blockSize - 1) / blockSize; blocks < need {
		return 0, fmt.Errorf("--kv-oversubscription %v gives %d KV blocks per worker, fewer than the %d of the largest request: lower --max-blocks, or raise --concurrency", oversubscription, blocks, need)
	}
	return blocks, nil
}

// WorkerSessions is how one worker served the run's sessions.
type WorkerSessions struct {
	// Sessions is the number of distinct sessions with a request answered by the worker.
	Sessions int `json:"sessions"`
	// Peak is the most sessions in progress at once whose latest request the worker answered:
	// the sessions whose KV it was asked to keep.
	Peak int `json:"peak_concurrent"`
}

// workerSessions computes every worker's WorkerSessions from the records of a run. A session
// sits on the worker of a request from that request's start until its next request starts, or
// the last one ends.
func workerSessions(recs []Record) map[string]WorkerSessions {
	bySession := map[int][]*Record{}
	for i := range recs {
		if recs[i].Worker != "" {
			bySession[recs[i].Session] = append(bySession[recs[i].Session], &recs[i])
		}
	}
	type event struct {
		at     time.Duration
		worker string
		delta  int
	}
	var events []event
	distinct := map[string]map[int]bool{}
	for s, rs := range bySession {
		slices.SortFunc(rs, func(a, b *Record) int { return cmp.Compare(a.Turn, b.Turn) })
		for k, r := range rs {
			if distinct[r.Worker] == nil {
				distinct[r.Worker] = map[int]bool{}
			}
			distinct[r.Worker][s] = true
			end := r.Start + r.E2E
			if k+1 < len(rs) {
				end = rs[k+1].Start
			}
			events = append(events, event{r.Start, r.Worker, 1}, event{end, r.Worker, -1})
		}
	}
	// Leaving before arriving at the same instant: a session moving on is not counted twice.
	slices.SortFunc(events, func(a, b event) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	out := make(map[string]WorkerSessions, len(distinct))
	now := map[string]int{}
	for _, e := range events {
		now[e.worker] += e.delta
		ws := out[e.worker]
		ws.Peak = max(ws.Peak, now[e.worker])
		out[e.worker] = ws
	}
	for w, ss := range distinct {
		ws := out[w]
		ws.Sessions = len(ss)
		out[w] = ws
	}
	return out
}

// ceilingLine states the workload's reuse ceiling; "" when it has none.
func ceilingLine(r *Report) string {
	if r.ReuseCeiling == nil {
		return ""
	}
	return fmt.Sprintf("reuse ceiling (hit rate of one infinite cache): %s", pct(*r.ReuseCeiling))
}

// pressureLines describe a target's KV pressure: the oversubscription, the preemptions, the
// duration, and the sessions per worker; nil unless the oversubscription is known.
func pressureLines(t *TargetReport) []string {
	var out []string
	if p := t.Pressure; p != nil {
		s := fmt.Sprintf("oversubscription %.2f× mean, %.2f× peak (working sets of the sessions in progress over %d KV tokens); run %s",
			p.Mean, p.Peak, p.KVCapacityTokens, (time.Duration(t.DurationSec * float64(time.Second))).Round(time.Second))
		if t.Preemptions != nil {
			s += fmt.Sprintf("; %.0f preemptions", *t.Preemptions)
		}
		out = append(out, "kv:        "+s)
	}
	if t.Pressure != nil && len(t.WorkerSessions) > 0 {
		parts := make([]string, 0, len(t.WorkerSessions))
		for _, w := range slices.Sorted(maps.Keys(t.WorkerSessions)) {
			ws := t.WorkerSessions[w]
			parts = append(parts, fmt.Sprintf("%s %d (peak %d)", shortWorker(w), ws.Sessions, ws.Peak))
		}
		out = append(out, "sessions:  "+strings.Join(parts, ", "))
	}
	return out
}
