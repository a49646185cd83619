package workers

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

func tenants(ws []*Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = string(w.ID())
	}
	return out
}

func TestPoolWithoutDataParallelismHasOneTenantPerURL(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 3, CBTimeout: time.Second})
	added, err := p.Add("http://a:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(added) != 1 || added[0].ID() != "http://a:1" || added[0].Rank() != -1 || added[0].URL() != "http://a:1" {
		t.Fatalf("Add = %v (rank %d), want one tenant http://a:1 with rank -1", tenants(added), added[0].Rank())
	}
	if added[0].Healthy() {
		t.Error("a new worker starts healthy; the first probe should decide")
	}
}

func TestPoolDataParallelSizeTwoMakesRankedTenants(t *testing.T) {
	p := NewPool(Options{DPSize: 2, CBFailureThreshold: 3, CBTimeout: time.Second})
	for _, u := range []string{"http://a:1", "http://b:2"} {
		if _, err := p.Add(u); err != nil {
			t.Fatalf("Add(%q): %v", u, err)
		}
	}
	want := []string{"http://a:1@0", "http://a:1@1", "http://b:2@0", "http://b:2@1"}
	if got := tenants(p.All()); !slices.Equal(got, want) {
		t.Fatalf("All = %v, want %v", got, want)
	}
	for i, w := range p.All() {
		if w.Rank() != i%2 {
			t.Errorf("%s: Rank = %d, want %d", w.ID(), w.Rank(), i%2)
		}
		if w.URL() != tenant.Base(string(w.ID())) {
			t.Errorf("%s: URL = %q", w.ID(), w.URL())
		}
	}
	a := p.Get("http://a:1")
	if got := tenants(a); !slices.Equal(got, want[:2]) {
		t.Errorf("Get(a) = %v, want %v", got, want[:2])
	}
	if a[0].Breaker() != a[1].Breaker() {
		t.Error("ranks of one URL do not share the URL's breaker")
	}
	if b := p.Get("http://b:2"); b[0].Breaker() == a[0].Breaker() {
		t.Error("two URLs share a breaker")
	}
	if got := p.URLs(); !slices.Equal(got, []string{"http://a:1", "http://b:2"}) {
		t.Errorf("URLs = %v", got)
	}

	removed, err := p.Remove("http://a:1")
	if err != nil {
		t.Fatal(err)
	}
	if got := tenants(removed); !slices.Equal(got, want[:2]) {
		t.Errorf("Remove returned %v, want every rank %v", got, want[:2])
	}
	if got := tenants(p.All()); !slices.Equal(got, want[2:]) {
		t.Errorf("All after Remove = %v, want %v", got, want[2:])
	}
	if got := p.Get("http://a:1"); len(got) != 0 {
		t.Errorf("Get of a removed URL = %v", tenants(got))
	}
	if got := p.URLs(); !slices.Equal(got, []string{"http://b:2"}) {
		t.Errorf("URLs after Remove = %v", got)
	}
}

func TestPoolAddTwiceAndRemoveUnknown(t *testing.T) {
	p := NewPool(Options{DPSize: 2})
	if _, err := p.Add("http://a:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Add("http://a:1"); !errors.Is(err, ErrExists) {
		t.Errorf("second Add: err = %v, want ErrExists", err)
	}
	if n := len(p.All()); n != 2 {
		t.Errorf("a refused Add changed the pool: %d tenants", n)
	}
	if _, err := p.Remove("http://nope:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove of unknown: err = %v, want ErrNotFound", err)
	}
}

func TestPoolSnapshotIsNotChangedByLaterAdds(t *testing.T) {
	p := NewPool(Options{})
	_, _ = p.Add("http://a:1")
	before := p.All()
	_, _ = p.Add("http://b:1")
	_, _ = p.Remove("http://a:1")
	if got := tenants(before); !slices.Equal(got, []string{"http://a:1"}) {
		t.Errorf("an earlier snapshot changed to %v", got)
	}
}

// fleet builds a pool of healthy workers; models[i] are the models of url i (nil: unknown).
func fleet(t *testing.T, models ...[]string) (*Pool, []*Worker) {
	t.Helper()
	p := NewPool(Options{CBFailureThreshold: 1, CBTimeout: time.Hour})
	var ws []*Worker
	for i, m := range models {
		added, err := p.Add("http://w" + string(rune('a'+i)) + ":8000")
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range added {
			w.SetHealthy(true)
			if m != nil {
				mm := slices.Clone(m)
				w.models.Store(&mm)
			}
			ws = append(ws, w)
		}
	}
	return p, ws
}

func TestCandidates(t *testing.T) {
	t.Run("single-model fleet: the served model and no name both reach every healthy worker", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"llama"}, []string{"llama"})
		ws[1].SetHealthy(false)
		for _, model := range []string{"llama", ""} {
			got, served, known := p.Candidates(model)
			if !known || served != "llama" || !slices.Equal(got, []*Worker{ws[0], ws[2]}) {
				t.Errorf("Candidates(%q) = %v, %q, %v; want the two healthy workers, llama, true", model, tenants(got), served, known)
			}
		}
	})
	t.Run("single-model fleet: another model name is not known", func(t *testing.T) {
		p, _ := fleet(t, []string{"llama"}, []string{"llama"})
		for _, model := range []string{"other-name", "Llama", strings.Repeat("x", 1<<20)} {
			if got, served, known := p.Candidates(model); known || served != "" || len(got) != 0 {
				t.Errorf("Candidates(%.20q) = %v, %q, %v; want nothing", model, tenants(got), served, known)
			}
		}
	})
	t.Run("no healthy worker at all: known, so the answer is 503 rather than 404", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"})
		ws[0].SetHealthy(false)
		if got, _, known := p.Candidates("anything"); !known || len(got) != 0 {
			t.Errorf("Candidates = %v, %v; want none, true", tenants(got), known)
		}
	})
	t.Run("workers listing no models serve any name, under no model", func(t *testing.T) {
		p, ws := fleet(t, nil, nil)
		got, served, known := p.Candidates("whatever")
		if !known || served != "" || !slices.Equal(got, ws) {
			t.Errorf("Candidates(whatever) = %v, %q, %v", tenants(got), served, known)
		}
	})
	t.Run("multi-model fleet: only servers of the model", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"qwen"}, []string{"llama", "qwen"})
		got, _, known := p.Candidates("qwen")
		if !known || !slices.Equal(got, []*Worker{ws[1], ws[2]}) {
			t.Errorf("Candidates(qwen) = %v, %v", tenants(got), known)
		}
		got, _, known = p.Candidates("llama")
		if !known || !slices.Equal(got, []*Worker{ws[0], ws[2]}) {
			t.Errorf("Candidates(llama) = %v, %v", tenants(got), known)
		}
	})
	t.Run("multi-model fleet: no model named means every healthy worker", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"qwen"})
		got, _, known := p.Candidates("")
		if !known || !slices.Equal(got, ws) {
			t.Errorf("Candidates(\"\") = %v, %v", tenants(got), known)
		}
	})
	t.Run("multi-model fleet: unknown model is not known", func(t *testing.T) {
		p, _ := fleet(t, []string{"llama"}, []string{"qwen"})
		got, _, known := p.Candidates("mistral")
		if known || len(got) != 0 {
			t.Errorf("Candidates(mistral) = %v, %v; want none, false", tenants(got), known)
		}
	})
	t.Run("model served only by unhealthy workers is not known", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"qwen"}, []string{"mistral"})
		ws[0].SetHealthy(false)
		got, _, known := p.Candidates("llama")
		if known || len(got) != 0 {
			t.Errorf("Candidates(llama) with its only server down = %v, %v; want none, false", tenants(got), known)
		}
	})
	t.Run("known model with its servers' breakers open: known, no candidates", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"qwen"})
		ws[0].Breaker().Record(false) // threshold 1
		got, _, known := p.Candidates("llama")
		if !known || len(got) != 0 {
			t.Errorf("Candidates(llama) = %v, %v; want none, true", tenants(got), known)
		}
	})
	t.Run("worker with unknown models serves any model", func(t *testing.T) {
		p, ws := fleet(t, []string{"llama"}, []string{"qwen"}, nil)
		got, _, known := p.Candidates("qwen")
		if !known || !slices.Equal(got, []*Worker{ws[1], ws[2]}) {
			t.Errorf("Candidates(qwen) = %v, %v", tenants(got), known)
		}
	})
	t.Run("unhealthy workers are never candidates", func(t *testing.T) {
		p, ws := fleet(t, nil, nil)
		for _, w := range ws {
			w.SetHealthy(false)
		}
		if got, _, _ := p.Candidates(""); len(got) != 0 {
			t.Errorf("Candidates = %v, want none", tenants(got))
		}
	})
}

func TestPoolModelsIsSortedUnionOfHealthy(t *testing.T) {
	p, ws := fleet(t, []string{"qwen", "llama"}, []string{"llama"}, []string{"mistral"})
	ws[2].SetHealthy(false)
	if got := p.Models(); !slices.Equal(got, []string{"llama", "qwen"}) {
		t.Errorf("Models = %v, want [llama qwen]", got)
	}
}

func TestServes(t *testing.T) {
	_, ws := fleet(t, []string{"a", "b"}, nil)
	if !ws[0].Serves("a") || !ws[0].Serves("b") || ws[0].Serves("c") {
		t.Errorf("Serves with models [a b] wrong")
	}
	if !ws[1].Serves("anything") {
		t.Errorf("a worker with unknown models does not serve any model")
	}
}

func TestReserveAndRelease(t *testing.T) {
	_, ws := fleet(t, nil)
	w := ws[0]
	l1, l2 := w.Reserve(), w.Reserve()
	if w.Load() != 2 {
		t.Fatalf("Load after two reserves = %d", w.Load())
	}
	if l1.Worker() != w {
		t.Error("Lease.Worker is not the reserved worker")
	}
	l1.Release()
	l1.Release()
	if w.Load() != 1 {
		t.Errorf("Load after releasing one lease twice = %d, want 1", w.Load())
	}
	l2.Release()
	if w.Load() != 0 {
		t.Errorf("Load = %d, want 0", w.Load())
	}
}

func TestLeaseReleaseExactlyOnceUnderConcurrentCalls(t *testing.T) {
	_, ws := fleet(t, nil)
	w := ws[0]
	// Every path that ends a request (completion, upstream error, client disconnect) may call
	// Release at the same moment; the load must drop by exactly one per lease.
	const leases, callers = 2000, 4
	for i := range leases {
		l := w.Reserve()
		if got := w.Load(); got != 1 {
			t.Fatalf("lease %d: Load = %d after Reserve, want 1", i, got)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Go(func() {
				<-start
				l.Release()
			})
		}
		close(start)
		wg.Wait()
		if got := w.Load(); got != 0 {
			t.Fatalf("lease %d: Load = %d after %d concurrent releases, want 0", i, got, callers)
		}
	}
}

func TestAvailableNeedsHealthAndClosedBreaker(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 1, CBTimeout: time.Hour})
	added, _ := p.Add("http://a:1")
	w := added[0]
	if w.Available() {
		t.Error("unhealthy worker is available")
	}
	w.SetHealthy(true)
	if !w.Available() {
		t.Error("healthy worker with a closed breaker is not available")
	}
	w.Breaker().Record(false)
	if w.Available() {
		t.Error("worker with an open breaker is available")
	}
}
