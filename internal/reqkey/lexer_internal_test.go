package reqkey

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// special8 must flag every word holding a byte a string loop has to look at, wherever it sits.
func TestSpecial8(t *testing.T) {
	check := func(w [8]byte) {
		want := false
		for _, c := range w {
			want = want || !plain[c]
		}
		if got := special8(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("special8(%q) = %v, want %v", w, got, want)
		}
	}
	for pos := range 8 {
		for c := range 256 {
			w := [8]byte{'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'}
			w[pos] = byte(c)
			check(w)
		}
	}
	r := rand.New(rand.NewPCG(1, 1))
	interesting := []byte{0, 0x1f, 0x20, 0x21, '"', 0x23, '\\', 0x5b, 0x5d, 0x7f, 0x80, 0xff, 'a', 'z'}
	for range 200000 {
		var w [8]byte
		for i := range w {
			w[i] = interesting[r.IntN(len(interesting))]
		}
		check(w)
	}
}
