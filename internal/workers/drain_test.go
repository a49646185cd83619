package workers

import (
	"testing"
	"time"
)

// A draining worker is no candidate, for a named model or none, while its in-flight attempt
// still closes normally; ending the drain makes it a candidate again. The health verdict is
// left alone throughout.
func TestDrainingWorkerTakesNoNewRequestsWhileInFlightOnesFinish(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 3, CBTimeout: time.Second})
	a, _ := p.Add("http://a:1")
	b, _ := p.Add("http://b:1")
	for _, w := range append(a, b...) {
		w.SetHealthy(true)
		w.models.Store(&[]string{"m"})
	}
	inflight := p.Acquire(a[0])
	a[0].SetDraining(true)
	for _, model := range []string{"m", ""} {
		got, _, known := p.Candidates(model)
		if !known || len(got) != 1 || got[0] != b[0] {
			t.Fatalf("model %q: candidates %v known %v, want only b", model, tenants(got), known)
		}
	}
	if !a[0].Healthy() || a[0].Available() || a[0].Load() != 1 {
		t.Fatalf("draining a: healthy %v available %v load %d", a[0].Healthy(), a[0].Available(), a[0].Load())
	}
	if !inflight.Close(Succeeded) || a[0].Load() != 0 {
		t.Fatalf("in-flight attempt on a draining worker did not close: load %d", a[0].Load())
	}
	a[0].SetDraining(false)
	if got, _, _ := p.Candidates("m"); len(got) != 2 {
		t.Fatalf("after the drain ended: candidates %v, want a and b", tenants(got))
	}
}

// With every worker of a model draining the model is still known (503, not 404).
func TestModelOfDrainingWorkersStaysKnown(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 3, CBTimeout: time.Second})
	a, _ := p.Add("http://a:1")
	a[0].SetHealthy(true)
	a[0].models.Store(&[]string{"m"})
	a[0].SetDraining(true)
	got, served, known := p.Candidates("m")
	if len(got) != 0 || !known || served != "m" {
		t.Fatalf("candidates %v served %q known %v, want none, m, true", tenants(got), served, known)
	}
}
