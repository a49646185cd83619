package responsesearch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// fleet starts one loopback worker per status, each answering every lookup with its status, and
// returns the searcher over them with its workers.
func fleet(t *testing.T, statuses ...int) (*Searcher, []*workers.Worker) {
	t.Helper()
	pool := workers.NewPool(workers.Options{})
	for _, status := range statuses {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		t.Cleanup(srv.Close)
		if _, err := pool.Add(srv.URL); err != nil {
			t.Fatal(err)
		}
	}
	pools := upstream.NewPools(upstream.PoolOptions{Dialer: upstream.Dialer{Timeouts: upstream.Timeouts{Dial: 2 * time.Second, Idle: time.Minute, Lookup: 10 * time.Second}}, MaxIdlePerWorker: 4})
	t.Cleanup(pools.CloseIdle)
	return New(Options{Concurrency: 2}, pools, metrics.New(pool)), pool.All()
}

func search(s *Searcher, id string, ws []*workers.Worker) (Result, int) {
	charged := 0
	res := s.Search(Query{ID: id, Candidates: ws, Deadline: time.Now().Add(20 * time.Second), Context: context.Background(),
		Lookup: func(out *fasthttp.Request, w *workers.Worker) { out.SetRequestURI(w.URL() + "/v1/responses/" + id) },
		Charge: func() bool { charged++; return true }})
	return res, charged
}

// The worker that answers 2xx holds the id; each lookup sent was charged.
func TestSearchFindsTheWorkerThatHasTheID(t *testing.T) {
	s, ws := fleet(t, http.StatusNotFound, http.StatusOK, http.StatusNotFound)
	res, charged := search(s, "resp_a", ws)
	if res.Holder != ws[1] {
		t.Fatalf("holder %v, want the worker that answered 200", res.Holder)
	}
	if charged < 2 {
		t.Errorf("%d lookups charged, want one per lookup sent (at least 2)", charged)
	}
}

// An id every worker answered 404 for is remembered as a miss; one that a worker could not say
// about (a 500) is not.
func TestSearchRemembersOnlyAnIDEveryWorkerDenied(t *testing.T) {
	s, ws := fleet(t, http.StatusNotFound, http.StatusNotFound, http.StatusNotFound)
	if res, _ := search(s, "resp_none", ws); res.Holder != nil || res.NotHere != 3 || res.Failed {
		t.Fatalf("result %+v, want 3 workers without it", res)
	}
	if !s.Missed("resp_none", time.Now()) {
		t.Fatal("an id no worker has was not remembered")
	}
	s, ws = fleet(t, http.StatusNotFound, http.StatusInternalServerError)
	if res, _ := search(s, "resp_maybe", ws); !res.Failed || res.Last.Kind != upstream.KindStatus || res.NotHere != 1 {
		t.Fatalf("result %+v, want one worker without it and one failed", res)
	}
	if s.Missed("resp_maybe", time.Now()) {
		t.Fatal("an id a worker could not say about was remembered as a miss")
	}
}

// A charge refused ends the search before any lookup goes out.
func TestSearchStopsWhenALookupIsRefusedItsCharge(t *testing.T) {
	s, ws := fleet(t, http.StatusOK)
	res := s.Search(Query{ID: "resp_a", Candidates: ws, Deadline: time.Now().Add(20 * time.Second), Context: context.Background(),
		Lookup: func(*fasthttp.Request, *workers.Worker) { t.Error("a lookup was prepared past its refused charge") },
		Charge: func() bool { return false }})
	if !res.Refused || res.Holder != nil {
		t.Fatalf("result %+v, want refused", res)
	}
}
