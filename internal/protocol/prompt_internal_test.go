package protocol

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// No number renders longer than maxRenderedFloatLen, which the routing text's bound allows each.
func TestRenderedNumbersFitMaxRenderedFloatLen(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	check := func(n string) {
		t.Helper()
		var w keyWriter
		renderPrompt(&w, valid(n), 0)
		if w.n > maxRenderedFloatLen {
			t.Fatalf("%s renders to %d bytes, over %d", n, w.n, maxRenderedFloatLen)
		}
	}
	for _, n := range []string{"-5e-324", "-4.9406564584124654e-324", "-2.2250738585072009e-308",
		"-1.7976931348623157e308", "-1e308", "-123456789012345678901234567890"} {
		check(n)
	}
	for range 200000 {
		if f := math.Float64frombits(r.Uint64()); !math.IsNaN(f) && !math.IsInf(f, 0) {
			check(strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
}
