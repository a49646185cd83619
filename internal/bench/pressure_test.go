package bench

import (
	"strings"
	"testing"
	"time"
)

// pressureWorkload has two sessions whose requests hold 100, 300 and 200 tokens: a mean working
// set of 200.
func pressureWorkload() Workload {
	return Workload{Name: "w", Sessions: []Session{
		{ID: "a", Turns: []Turn{{Tokens: 100}, {Tokens: 300}}},
		{ID: "b", Turns: []Turn{{Tokens: 200}}},
	}}
}

func TestPlannedWorkingSet_IsTheLiveSessionsTimesTheMeanRequest(t *testing.T) {
	w := pressureWorkload()
	if ws, ok := w.PlannedWorkingSet(8); !ok || ws != 400 {
		t.Fatalf("concurrency 8 over 2 sessions: %v %v, want 2 × 200", ws, ok)
	}
	if ws, _ := w.PlannedWorkingSet(1); ws != 200 {
		t.Fatalf("concurrency 1: %v, want 200", ws)
	}
	w.Sessions[1].Turns[0].Tokens = 0
	if _, ok := w.PlannedWorkingSet(2); ok {
		t.Fatal("a workload with a request of unknown size has a working set")
	}
}

func TestKVBlocksFor_SizesTheFleetAtTheOversubscriptionAndRefusesWhatCannotHoldARequest(t *testing.T) {
	w := pressureWorkload()
	// 2 sessions × 200 tokens = 400 at 2× over 2 workers: 100 tokens each, 7 blocks of 16.
	// The largest request, 300 tokens, needs 19: refused.
	if _, err := w.KVBlocksFor(2, 8, 2, 16); err == nil || !strings.Contains(err.Error(), "largest request") {
		t.Fatalf("err %v, want the largest request named", err)
	}
	w.Sessions[0].Turns[1].Tokens = 100 // now 100, 100, 200: mean 133.3, planned 266.7
	got, err := w.KVBlocksFor(0.5, 8, 2, 16)
	if err != nil || got != 17 { // 266.7 / 0.5 / 2 / 16 = 16.7
		t.Fatalf("blocks %d, %v; want 17", got, err)
	}
	if _, err := (&Workload{Name: "agent", Sessions: []Session{{Turns: []Turn{{}}}}}).KVBlocksFor(1, 1, 1, 16); err == nil {
		t.Fatal("a workload without working sets was sized")
	}
}

func TestMeasuredPressure_AveragesTheSteadySamples(t *testing.T) {
	samples := []loadSample{
		{steady: false, working: 9000}, // ramp: not counted
		{steady: true, working: 1000},
		{steady: true, working: 3000},
	}
	p := measuredPressure(samples, 1000)
	if p == nil || p.Mean != 2 || p.Peak != 3 || p.KVCapacityTokens != 1000 {
		t.Fatalf("pressure %+v, want mean 2, peak 3", p)
	}
	if measuredPressure(samples, 0) != nil {
		t.Fatal("pressure without a capacity")
	}
}

func TestWorkerSessions_CountsDistinctSessionsAndTheMostSittingOnAWorkerAtOnce(t *testing.T) {
	s := time.Second
	recs := []Record{
		// Session 0: on w1 from 0 to 10, then on w2 from 10 to 15.
		{Session: 0, Turn: 0, Start: 0, E2E: 2 * s, Worker: "w1"},
		{Session: 0, Turn: 1, Start: 10 * s, E2E: 5 * s, Worker: "w2"},
		// Session 1: on w1 from 5 to 20.
		{Session: 1, Turn: 0, Start: 5 * s, E2E: 15 * s, Worker: "w1"},
		// Session 2: on w1 from 10 to 12: session 0 left w1 at 10 as it came.
		{Session: 2, Turn: 0, Start: 10 * s, E2E: 2 * s, Worker: "w1"},
		{Session: 2, Turn: 1, Err: "HTTP 500"}, // no worker: not counted
	}
	got := workerSessions(recs)
	if w1 := got["w1"]; w1.Sessions != 3 || w1.Peak != 2 {
		t.Fatalf("w1 %+v, want 3 sessions, peak 2", w1)
	}
	if w2 := got["w2"]; w2.Sessions != 1 || w2.Peak != 1 {
		t.Fatalf("w2 %+v, want 1 session, peak 1", w2)
	}
}
