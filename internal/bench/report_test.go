package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func testRecords() []Record {
	return []Record{
		{PromptTokens: 1000, CachedTokens: 0, OutputTokens: 10, TTFT: 100 * time.Millisecond, E2E: 200 * time.Millisecond, Worker: "http://w1", Decision: "session_id_match"},
		{PromptTokens: 1200, CachedTokens: 992, OutputTokens: 12, TTFT: 20 * time.Millisecond, E2E: 120 * time.Millisecond, Worker: "http://w1", Decision: "session_id_match"},
		{PromptTokens: 300, CachedTokens: 160, OutputTokens: 8, TTFT: 40 * time.Millisecond, E2E: 90 * time.Millisecond, Worker: "http://w2", Decision: "full_history_match"},
		{Err: "HTTP 503: busy", Decision: "load_balance"},
	}
}

func TestReportITLPoolsTheGapsOfEverySuccessfulStream(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		{PromptTokens: 10, Gaps: []time.Duration{5 * ms, 5 * ms, 5 * ms}},
		{PromptTokens: 10, Gaps: []time.Duration{30 * ms}},
		{Err: "HTTP 500", Gaps: []time.Duration{900 * ms}}, // a failed request does not count
	}
	r := summarize(&Target{Name: "x"}, runResult{records: recs, wall: time.Second}, 0.5)
	// Four gaps pooled, in simulated time (wall / 0.5): 10, 10, 10, 60 ms.
	if r.ITL.P50 != 10 || r.ITL.P99 <= 10 || r.ITL.P99 > 60 {
		t.Fatalf("ITL %+v, want p50 10 ms and p99 toward the 60 ms gap", r.ITL)
	}
}

func TestReportHitRateIsCachedOverPromptOfTheResponses(t *testing.T) {
	recs := testRecords()
	r := summarize(&Target{Name: "x", SessionMode: SessionHeader}, runResult{records: recs, wall: 2 * time.Second}, 1)
	var cached, prompt int
	for _, rec := range recs {
		if rec.Err == "" {
			cached += rec.CachedTokens
			prompt += rec.PromptTokens
		}
	}
	if want := float64(cached) / float64(prompt); r.HitRate != want || r.HitRate != 1152.0/2500 {
		t.Fatalf("hit rate %v, want %v", r.HitRate, want)
	}
	if r.Requests != 3 || r.Errors != 1 || r.PromptTokens != 2500 || r.OutputTokens != 30 {
		t.Fatalf("counts %+v", r)
	}
	if r.Decisions["session_id_match"] != 2 || r.Decisions["load_balance"] != 1 {
		t.Fatalf("decisions %v", r.Decisions)
	}
	if math.Abs(r.WorkerShare["http://w1"]-2.0/3) > 1e-9 || len(r.WorkerShare) != 2 {
		t.Fatalf("shares %v", r.WorkerShare)
	}
	if r.TTFT.P50 != 40 || r.E2E.P50 != 120 || r.RequestsPerSec != 1.5 || r.OutputTokensPerSec != 15 {
		t.Fatalf("ttft %+v e2e %+v rps %v tps %v", r.TTFT, r.E2E, r.RequestsPerSec, r.OutputTokensPerSec)
	}
	if len(r.ErrorSamples) != 1 || r.Imbalance != nil {
		t.Fatalf("errors %v imbalance %v", r.ErrorSamples, r.Imbalance)
	}
}

func TestReportScalesTimesToFullScale(t *testing.T) {
	r := summarize(&Target{Name: "x"}, runResult{records: testRecords()[:1], wall: time.Second}, 0.1)
	if r.TTFT.P50 != 1000 || r.DurationSec != 10 || r.WallSec != 1 || r.RequestsPerSec != 0.1 {
		t.Fatalf("ttft %v, duration %v, wall %v, rps %v", r.TTFT.P50, r.DurationSec, r.WallSec, r.RequestsPerSec)
	}
}

func TestRenderings(t *testing.T) {
	hit := 0.5
	rep := &Report{Workload: "agent", Sessions: 2, Requests: 4, Concurrency: 2, TimeScale: 0.1, Targets: []TargetReport{
		summarize(&Target{Name: "round_robin"}, runResult{records: testRecords(), wall: time.Second}, 0.1),
		summarize(&Target{Name: "cache<aware>"}, runResult{records: testRecords()[:2], wall: time.Second}, 0.1),
	}}
	rep.Targets[1].WorkerHitRate = &hit
	rep.Targets[1].Imbalance = &Imbalance{Peak: 1.25, Mean: 1.1}

	var table bytes.Buffer
	if err := WriteTable(&table, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(table.String(), "\n")
	header := lines[2]
	for _, col := range []string{"hit rate", "TTFT p50", "TTFT p99", "imbalance"} {
		if !strings.Contains(header, col) {
			t.Fatalf("table header %q lacks %q", header, col)
		}
	}
	if !strings.Contains(table.String(), "46.1%") || !strings.Contains(table.String(), "1.25 / 1.10") || !strings.Contains(table.String(), "n/a") {
		t.Fatalf("table:\n%s", table.String())
	}
	col := strings.Index(header, "hit rate")
	for _, l := range lines[3:5] {
		if len(l) <= col || l[col-1] != ' ' {
			t.Fatalf("columns not aligned:\n%s", table.String())
		}
	}

	var js bytes.Buffer
	if err := WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Targets) != 2 || back.Targets[0].HitRate != rep.Targets[0].HitRate {
		t.Fatalf("JSON round trip: %v %+v", err, back)
	}

	var md bytes.Buffer
	_ = WriteMarkdown(&md, rep)
	if !strings.Contains(md.String(), "| round_robin | 46.1% |") || !strings.Contains(md.String(), "|---|---:|") {
		t.Fatalf("markdown:\n%s", md.String())
	}

	var svg bytes.Buffer
	_ = WriteSVG(&svg, rep)
	s := svg.String()
	if !strings.HasPrefix(s, "<svg ") || !strings.Contains(s, "cache&lt;aware&gt;") || strings.Count(s, "<rect") < 1+2+4 {
		t.Fatalf("svg:\n%s", s)
	}
}

func TestSameWorkerIsTheShareOfLaterTurnsOnThePreviousTurnsWorker(t *testing.T) {
	recs := []Record{
		{Session: 0, Turn: 0, Worker: "a"}, {Session: 0, Turn: 1, Worker: "a"}, {Session: 0, Turn: 2, Worker: "b"},
		{Session: 1, Turn: 1, Worker: "c"}, {Session: 1, Turn: 0, Worker: "c"}, // out of order
		{Session: 1, Turn: 2, Worker: "d", Err: "HTTP 404: gone", Status: 404, Chained: true},
		{Session: 2, Turn: 0, Err: "refused"}, {Session: 2, Turn: 1, Worker: "a"}, // no worker before: not counted
	}
	r := summarize(&Target{Name: "x"}, runResult{records: recs}, 1)
	if r.SameWorker == nil || *r.SameWorker != 2.0/4 || r.ResponseNotFound != 1 {
		t.Fatalf("same worker %v, not found %d", r.SameWorker, r.ResponseNotFound)
	}
	if r := summarize(&Target{Name: "x"}, runResult{records: recs[:1]}, 1); r.SameWorker != nil {
		t.Fatalf("one turn: same worker %v", *r.SameWorker)
	}
}

// The chain columns appear for --api responses-chain only; the JSON always has both figures.
func TestChainColumnsOnlyForResponsesChain(t *testing.T) {
	share := 0.25
	tr := summarize(&Target{Name: "round_robin"}, runResult{records: testRecords(), wall: time.Second}, 1)
	tr.ResponseNotFound, tr.SameWorker = 7, &share
	for _, api := range APIs {
		rep := &Report{Workload: "agent", API: api, Targets: []TargetReport{tr}}
		var table, md, js bytes.Buffer
		_ = WriteTable(&table, rep)
		_ = WriteMarkdown(&md, rep)
		_ = WriteJSON(&js, rep)
		chain := api == APIResponsesChain
		if got := strings.Contains(table.String(), "not found") && strings.Contains(table.String(), "same worker"); got != chain {
			t.Errorf("%s: table has the chain columns: %v\n%s", api, got, table.String())
		}
		if got := strings.Contains(md.String(), "| n/a | 7 | 25.0% |"); got != chain {
			t.Errorf("%s: markdown row ends with the chain cells: %v\n%s", api, got, md.String())
		}
		if !strings.Contains(table.String(), "25.0% of later turns on the previous turn's worker") {
			t.Errorf("%s: table lacks the same-worker line\n%s", api, table.String())
		}
		var back map[string]any
		_ = json.Unmarshal(js.Bytes(), &back)
		tj := back["targets"].([]any)[0].(map[string]any)
		if back["api"] != api || tj["response_not_found"] != 7.0 || tj["same_worker_later_turns"] != 0.25 {
			t.Errorf("%s: JSON %v", api, tj)
		}
	}
}

// A router that predicted no cached token at all (a baseline policy sends a prefix match of 0)
// shows a dash in the predicted column, not 0.0%; one that sent no prediction shows n/a.
func TestPredictedColumnShowsADashForARouterThatPredictsNothing(t *testing.T) {
	withMatch := func(match float64) []Record {
		recs := testRecords()
		for i := range recs {
			recs[i].PrefixMatch, recs[i].HasPrefixMatch = match, true
		}
		return recs
	}
	rep := &Report{Workload: "agent", Targets: []TargetReport{
		summarize(&Target{Name: "round_robin"}, runResult{records: withMatch(0), wall: time.Second}, 1),
		summarize(&Target{Name: "cache_aware"}, runResult{records: withMatch(0.5), wall: time.Second}, 1),
		summarize(&Target{Name: "external"}, runResult{records: testRecords(), wall: time.Second}, 1),
	}}
	var table, md bytes.Buffer
	_ = WriteTable(&table, rep)
	_ = WriteMarkdown(&md, rep)
	for _, want := range []string{"| round_robin | 46.1% | — |", "| cache_aware | 46.1% | 50.0% |", "| external | 46.1% | n/a |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.Contains(table.String(), "\nround_robin  46.1%     —          n/a") {
		t.Errorf("table:\n%s", table.String())
	}
	if p := rep.Targets[0].PredictedHitRate; p == nil || *p != 0 {
		t.Errorf("the JSON's predicted_hit_rate is %v, want 0: the figure the router sent", p)
	}
}
