package bench

import (
	"math"
	"testing"
)

func TestPercentileOnKnownData(t *testing.T) {
	xs := []float64{15, 20, 35, 40, 50} // unsorted input must not matter
	shuffled := []float64{40, 15, 50, 35, 20}
	for _, tc := range []struct{ p, want float64 }{
		{0, 15}, {25, 20}, {50, 35}, {75, 40}, {100, 50}, {40, 29}, {90, 46},
	} {
		if got := Percentile(shuffled, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if shuffled[0] != 40 {
		t.Error("Percentile sorted its input in place")
	}
	one := make([]float64, 100)
	for i := range one {
		one[i] = float64(i + 1)
	}
	if got := Percentile(one, 99); math.Abs(got-99.01) > 1e-9 {
		t.Errorf("p99 of 1..100 = %v, want 99.01", got)
	}
	if Percentile(nil, 50) != 0 || Percentile([]float64{7}, 99) != 7 {
		t.Error("empty or single-element data")
	}
	_ = xs
}

func TestImbalanceUsesSteadyWindows(t *testing.T) {
	var samples []loadSample
	// 10 steady samples alternating (2,0) and (0,2): each instant is 2× imbalanced, the window
	// is balanced.
	for i := range 10 {
		l := []float64{2, 0}
		if i%2 == 1 {
			l = []float64{0, 2}
		}
		samples = append(samples, loadSample{loads: l, steady: true})
	}
	// 10 steady samples of (3,1): 1.5.
	for range 10 {
		samples = append(samples, loadSample{loads: []float64{3, 1}, steady: true})
	}
	// Drain samples are ignored, however imbalanced.
	for range 30 {
		samples = append(samples, loadSample{loads: []float64{1, 0}, steady: false})
	}
	got := imbalance(samples, 10)
	if got == nil {
		t.Fatal("no imbalance")
	}
	if got.Samples != 20 || got.Peak != 1.5 || got.Mean != 1.25 || got.PeakInstant != 2 {
		t.Fatalf("imbalance %+v, want 20 samples, peak 1.5, mean 1.25, instant 2", *got)
	}
	if imbalance(samples[:5], 10) != nil {
		t.Fatal("fewer samples than a window gave a figure")
	}
}
