package bench

import (
	"math"
	"slices"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of xs by linear interpolation between
// the closest ranks: with xs sorted, rank p/100 × (n-1). It returns 0 for no data. xs is not
// modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	r := math.Max(0, math.Min(1, p/100)) * float64(len(s)-1)
	lo := int(math.Floor(r))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(r-float64(lo))
}

// ImbalanceWindow is the number of consecutive load samples averaged before the imbalance is
// taken: 10 samples of 10ms. A single instant is dominated by integer noise (one request in
// flight on four workers reads as 4× imbalanced); a short window shows which worker is
// persistently busier.
const ImbalanceWindow = 10

// Imbalance summarizes how evenly in-flight requests were spread over the workers: the ratio of
// the busiest worker's load to the mean load, over windows of ImbalanceWindow steady samples.
type Imbalance struct {
	Peak        float64 `json:"peak"`         // highest windowed max/mean
	Mean        float64 `json:"mean"`         // mean windowed max/mean
	PeakInstant float64 `json:"peak_instant"` // highest max/mean of a single sample
	Samples     int     `json:"samples"`      // steady samples used
}

// imbalance computes the Imbalance of samples, using only steady ones: those taken while the
// workload kept its full concurrency (closed loop), or while at least as many requests as
// workers were in flight (paced). Ramp-down at the end of a run would otherwise count as
// imbalance that no placement can avoid. It returns nil when no window could be formed.
func imbalance(samples []loadSample, window int) *Imbalance {
	var steady [][]float64
	for _, s := range samples {
		if s.steady && len(s.loads) > 0 {
			steady = append(steady, s.loads)
		}
	}
	if len(steady) < window || window < 1 {
		return nil
	}
	out := &Imbalance{Samples: len(steady)}
	for _, l := range steady {
		out.PeakInstant = math.Max(out.PeakInstant, maxOverMean(l))
	}
	var sum float64
	n := 0
	for i := 0; i+window <= len(steady); i += window {
		avg := make([]float64, len(steady[i]))
		for _, l := range steady[i : i+window] {
			for k := range avg {
				if k < len(l) {
					avg[k] += l[k] / float64(window)
				}
			}
		}
		r := maxOverMean(avg)
		if r == 0 {
			continue
		}
		out.Peak = math.Max(out.Peak, r)
		sum += r
		n++
	}
	if n == 0 {
		return nil
	}
	out.Mean = sum / float64(n)
	return out
}

// maxOverMean returns max(l)/mean(l), or 0 when nothing is in flight.
func maxOverMean(l []float64) float64 {
	var sum, hi float64
	for _, v := range l {
		sum += v
		hi = math.Max(hi, v)
	}
	if sum == 0 {
		return 0
	}
	return hi / (sum / float64(len(l)))
}
