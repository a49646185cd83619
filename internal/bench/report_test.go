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
