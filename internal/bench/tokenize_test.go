package bench

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestKVEventsBenchCountsTokenizeCallsPerRequest: with --kv-events, each entry reports its routers'
// /tokenize calls per request, read from their own counters: requests without session ids are
// tokenized (a new prompt each turn, so once each), requests with one only on their session's
// first turn; the text table shows the figure.
func TestKVEventsBenchCountsTokenizeCallsPerRequest(t *testing.T) {
	ps := mustPolicies(t, []string{"ids=cache_aware", "none=cache_aware:none"}, SessionHeader)
	rep := mustRun(t, Options{Workload: replayAgent(t, 4), Policies: ps, Workers: 2, Sim: scaledSim(0.01),
		KVEvents: true, Concurrency: 1, Timeout: 30 * time.Second})
	ids, none := rep.Targets[0], rep.Targets[1]
	for _, tr := range []TargetReport{ids, none} {
		if tr.Errors != 0 || tr.TokenizeCallsPerRequest == nil || tr.TokenizeCachedPerRequest == nil {
			t.Fatalf("%s: %d errors %v, tokenize calls %v cached %v", tr.Name, tr.Errors, tr.ErrorSamples,
				tr.TokenizeCallsPerRequest, tr.TokenizeCachedPerRequest)
		}
	}
	// With ids, a session is tokenized only until its first block is recorded, to check it against
	// the events later: on its first turn, and on its second when the first came before its
	// worker's engine had published anything (a fresh fleet), which routes on the first turn's
	// tokens (cached) while its own are asked in the background. Its worker keeps it, so no later
	// turn is.
	once := float64(rep.Sessions) / float64(ids.Requests)
	if got := *ids.TokenizeCallsPerRequest; got < once || got > 2*once || *ids.TokenizeCachedPerRequest > once {
		t.Fatalf("with session ids: %v tokenize calls and %v cached per request, want %v to %v (the first turns), at most %v cached",
			got, *ids.TokenizeCachedPerRequest, once, 2*once, once)
	}
	// Without ids every request's tokens are asked: a first turn's on its path, a later turn's in
	// the background while it routes on its earlier turn's (the last turns' may still be on their
	// way when the run ends).
	later := 1 - once
	if calls := *none.TokenizeCallsPerRequest; calls > 1 || calls < later || *none.TokenizeCachedPerRequest != later {
		t.Fatalf("without session ids: %v tokenize calls and %v cached per request, want %v to 1 calls and %v cached (the later turns)",
			calls, *none.TokenizeCachedPerRequest, later, later)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, rep); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("tokenize:  %.2f calls per request, %.2f answered from the token cache (the prompt's or an earlier turn's)",
		*none.TokenizeCallsPerRequest, *none.TokenizeCachedPerRequest)
	if !strings.Contains(out.String(), want) {
		t.Fatalf("the table does not show the tokenize calls:\n%s", out.String())
	}
}

// TestBenchWithoutKVEventsReportsNoTokenizeCalls: an entry whose routers do not route on events
// has no tokenize figure, rather than a 0 that would read as free.
func TestBenchWithoutKVEventsReportsNoTokenizeCalls(t *testing.T) {
	ps := mustPolicies(t, []string{"cache_aware:none"}, SessionHeader)
	rep := mustRun(t, Options{Workload: replayAgent(t, 2), Policies: ps, Workers: 2, Sim: scaledSim(0.01),
		Concurrency: 1, Timeout: 30 * time.Second})
	if tr := rep.Targets[0]; tr.TokenizeCallsPerRequest != nil {
		t.Fatalf("tokenize calls %v per request without --kv-events", *tr.TokenizeCallsPerRequest)
	}
}
