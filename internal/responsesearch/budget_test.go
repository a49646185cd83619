package responsesearch

import (
	"fmt"
	"testing"
	"time"
)

func TestSearchBudgetRefillsWithTime(t *testing.T) {
	b := newClientBudget(60) // one a second, sixty at once
	now := time.Now()
	for i := range 60 {
		if _, ok := b.allow("a", now); !ok {
			t.Fatalf("search %d of a minute's worth refused", i)
		}
	}
	wait, ok := b.allow("a", now)
	if ok || wait != time.Second {
		t.Fatalf("61st search: allowed %v, wait %v; want refused for 1s", ok, wait)
	}
	if _, ok := b.allow("b", now); !ok {
		t.Fatal("another client's budget was taken")
	}
	if _, ok := b.allow("a", now.Add(time.Second)); !ok {
		t.Fatal("a second later, no search was back")
	}
}

func TestSearchBudgetKeepsABoundedNumberOfClients(t *testing.T) {
	b := newClientBudget(1)
	now := time.Now()
	for i := range maxSearchClients + 100 {
		b.allow(fmt.Sprint("client-", i), now)
	}
	if n := len(b.full); n > maxSearchClients {
		t.Fatalf("%d clients kept, want at most %d", n, maxSearchClients)
	}
}

func TestTotalSearchBudgetAllowsASecondsWorthThenOneEachInterval(t *testing.T) {
	b := newTotalBudget(10)
	now := time.Now()
	for i := range 10 {
		if _, ok := b.allow("", now); !ok {
			t.Fatalf("search %d of a second's worth refused", i)
		}
	}
	if wait, ok := b.allow("", now); ok || wait != 100*time.Millisecond {
		t.Fatalf("11th search: allowed %v, wait %v; want refused for 100ms", ok, wait)
	}
	if _, ok := b.allow("", now.Add(100*time.Millisecond)); !ok {
		t.Fatal("100ms later, no search was back")
	}
	slow := newTotalBudget(0.5) // fewer than one a second: one at once
	if _, ok := slow.allow("", now); !ok {
		t.Fatal("the first search refused")
	}
	if wait, ok := slow.allow("", now); ok || wait != 2*time.Second {
		t.Fatalf("second search: allowed %v, wait %v; want refused for 2s", ok, wait)
	}
	if _, ok := newTotalBudget(0).allow("", now); !ok {
		t.Fatal("no bound refused a search")
	}
}

// A miss is remembered for MissTTL from the clock it was given, and forgotten after.
func TestMissIsRememberedForItsTTL(t *testing.T) {
	m := newMisses()
	now := time.Now()
	m.add("resp_nowhere", now)
	if !m.has("resp_nowhere", now.Add(MissTTL)) || m.has("resp_other", now) {
		t.Fatal("a miss is not remembered within its time, or another id is")
	}
	if m.has("resp_nowhere", now.Add(MissTTL+time.Second)) {
		t.Fatal("a miss is remembered past its time")
	}
}

// The misses remembered are bounded; the oldest go first.
func TestMissesKeepABoundedNumberOfIDs(t *testing.T) {
	m := newMisses()
	now := time.Now()
	for i := range maxResponseMisses + 10 {
		m.add(fmt.Sprint("resp_", i), now)
	}
	if n := len(m.until); n != maxResponseMisses {
		t.Fatalf("%d ids kept, want %d", n, maxResponseMisses)
	}
	if m.has("resp_0", now) || !m.has(fmt.Sprint("resp_", maxResponseMisses+9), now) {
		t.Fatal("the oldest id was kept, or the newest dropped")
	}
}
