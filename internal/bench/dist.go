package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of token counts, written "fixed:N", "uniform:MIN,MAX" or
// "lognormal:MEDIAN,SIGMA". Draws are clamped to [1, Max] (lognormal: Max is 16 × median).
type Dist struct {
	Kind string  // "fixed", "uniform" or "lognormal"
	A, B float64 // N; MIN, MAX; or MEDIAN, SIGMA
}

// ParseDist reads a Dist from its written form.
func ParseDist(s string) (Dist, error) {
	kind, args, _ := strings.Cut(strings.TrimSpace(s), ":")
	var nums []float64
	for _, f := range strings.Split(args, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Dist{}, fmt.Errorf("distribution %q: %q is not a non-negative number", s, f)
		}
		nums = append(nums, v)
	}
	want := map[string]int{"fixed": 1, "uniform": 2, "lognormal": 2}
	n, ok := want[kind]
	if !ok {
		return Dist{}, fmt.Errorf("distribution %q: want fixed:N, uniform:MIN,MAX or lognormal:MEDIAN,SIGMA", s)
	}
	if len(nums) != n {
		return Dist{}, fmt.Errorf("distribution %q: %s takes %d numbers", s, kind, n)
	}
	d := Dist{Kind: kind, A: nums[0]}
	if n == 2 {
		d.B = nums[1]
	}
	if kind == "uniform" && d.B < d.A {
		return Dist{}, fmt.Errorf("distribution %q: max below min", s)
	}
	if d.A < 1 {
		return Dist{}, fmt.Errorf("distribution %q: sizes must be at least 1", s)
	}
	return d, nil
}

// String returns the written form.
func (d Dist) String() string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	if d.Kind == "fixed" {
		return "fixed:" + f(d.A)
	}
	return d.Kind + ":" + f(d.A) + "," + f(d.B)
}

// Draw returns one size.
func (d Dist) Draw(rng *rand.Rand) int {
	var v float64
	switch d.Kind {
	case "uniform":
		v = d.A + rng.Float64()*(d.B-d.A)
	case "lognormal":
		v = d.A * math.Exp(d.B*rng.NormFloat64())
		v = min(v, 16*d.A)
	default:
		v = d.A
	}
	return max(1, int(math.Round(v)))
}
