package predict

import (
	"testing"
	"time"
)

func TestAWorkerWithoutAnswersIsPredictedByThePriors(t *testing.T) {
	m := New()
	got := m.TTFT("w", Work{Compute: 1000, Ahead: 1000})
	if want := DefaultOverhead + 2000*DefaultPerToken; got != want {
		t.Fatalf("TTFT %v, want %v", got, want)
	}
}

func TestTheRateIsLearnedFromWhatRequestsAchieved(t *testing.T) {
	m := New()
	// This worker computes a token in 20 µs, with 5 ms of overhead.
	truth := func(w Work) time.Duration {
		return 5*time.Millisecond + time.Duration(w.Compute+w.Ahead)*20*time.Microsecond
	}
	for i := 0; i < 400; i++ {
		w := Work{Compute: 100 + (i%7)*3000, Ahead: (i % 3) * 2000}
		m.Observe("fast", w, truth(w))
	}
	w := Work{Compute: 50000}
	got, want := m.TTFT("fast", w), truth(w)
	if got < want*9/10 || got > want*11/10 {
		t.Fatalf("learned TTFT %v for 50k tokens, want within 10%% of %v", got, want)
	}
	if m.TTFT("other", w) == got {
		t.Fatal("another worker was taught the first one's rate")
	}
	m.Forget("fast")
	if m.TTFT("fast", w) != m.TTFT("other", w) {
		t.Fatal("a forgotten worker kept its figures")
	}
}

func TestAQueueAheadCostsAsMuchAsTheSamePrefill(t *testing.T) {
	m := New()
	if a, b := m.TTFT("w", Work{Compute: 10, Ahead: 5000}), m.TTFT("w", Work{Compute: 5010}); a != b {
		t.Fatalf("5000 tokens ahead cost %v, 5000 more to compute %v", a, b)
	}
}
