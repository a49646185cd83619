package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
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

// printable must stop at the first control byte or byte outside ASCII, wherever it sits.
func TestPrintable(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	interesting := []byte{0, 0x1f, 0x20, 0x21, '"', '\\', 0x7e, 0x7f, 0x80, 0xc3, 0xff, 'a'}
	for range 200000 {
		b := make([]byte, r.IntN(80))
		for i := range b {
			b[i] = 'a'
			if r.IntN(40) == 0 {
				b[i] = interesting[r.IntN(len(interesting))]
			}
		}
		want := 0
		for want < len(b) && b[want] >= 0x20 && b[want] < 0x80 {
			want++
		}
		if got := printable(b); got != want {
			t.Fatalf("printable(%q) = %d, want %d", b, got, want)
		}
	}
}

// The lexer accepts exactly the strings encoding/json accepts, whatever comes after a long run of
// plain bytes, reads them to the same end, and bounds the growth of their values.
func TestLexerStrMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	pieces := []string{"a", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\ud83d\\ude00", "\\ud800", "é", "\xff", "\xe2\x80\xa8",
		"\x01", "\x1f", "\x7f", "\\x", "\\u12", "\\", "\"",
		"the router sends each request to the worker", "0123456789abcdef0123456789abcdef0",
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	for range 100000 {
		doc := []byte{'"'}
		for range r.IntN(12) {
			doc = append(doc, pieces[r.IntN(len(pieces))]...)
		}
		if r.IntN(4) > 0 {
			doc = append(doc, '"')
		}
		doc = append(doc, []byte(" , ]")[:r.IntN(5)]...)
		s := scanner{data: doc}
		raw, _, _ := s.str()
		var want string
		end := len(doc)
		dec := json.NewDecoder(bytes.NewReader(doc))
		err := dec.Decode(&want)
		if err == nil {
			end = int(dec.InputOffset())
		}
		switch {
		case (s.err == nil) != (err == nil):
			t.Fatalf("%q: lexer error %v, encoding/json error %v", doc, s.err, err)
		case s.err != nil:
			continue
		case s.pos != end:
			t.Fatalf("%q: lexer read to %d, encoding/json to %d", doc, s.pos, end)
		case string(unquote(raw)) != want:
			t.Fatalf("%q: lexer value %q, encoding/json %q", doc, unquote(raw), want)
		case len(want) > len(raw)+s.grow:
			t.Fatalf("%q: value of %d bytes, over the bound of %d", doc, len(want), len(raw)+s.grow)
		}
		// The value is measured and written as it decodes, as a field: the value and its end.
		j := jstr{raw: raw}
		field := want + "\xff"
		var count keyWriter
		count.field(j)
		w := writerOf(len(field))
		w.field(j)
		if j.len() != len(want) || count.n != len(field) || w.string() != field || w.n != len(field) {
			t.Fatalf("%q: value %q measured %d, field %q measured %d", doc, want, j.len(), w.string(), count.n)
		}
	}
}
