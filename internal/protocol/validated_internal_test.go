package protocol

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// valid.str finds the same end of a string as the lexer and tells its value from its contents as
// the lexer's flags do, wherever the string sits in the document, including its last bytes, and
// whether its escapes and bytes outside ASCII come after a long run of ASCII or not.
func TestValidStrMatchesLexer(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pieces := []string{"a", "Z", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\ud83d\\ude00", "é", "\xff", "\xe2\x80\xa8", "~", "\\/",
		"the router sends each request to the worker", "0123456789abcdef0123456789abcdef0"}
	for range 100000 {
		doc := []byte{}
		for range r.IntN(3) {
			doc = append(doc, ' ')
		}
		start := len(doc)
		doc = append(doc, '"')
		for range r.IntN(40) {
			doc = append(doc, pieces[r.IntN(len(pieces))]...)
		}
		doc = append(doc, '"')
		for range r.IntN(12) {
			doc = append(doc, "]}, "[r.IntN(4)])
		}
		s := scanner{data: doc, pos: start}
		raw, escaped, high := s.str()
		if s.err != nil {
			t.Fatalf("%q: %v", doc, s.err)
		}
		got, end := valid(doc).str(start)
		if string(got.raw) != string(raw) || end != s.pos {
			t.Fatalf("%q: str read %q to %d, the lexer %q to %d", doc, got.raw, end, raw, s.pos)
		}
		if want := !escaped && (!high || utf8.Valid(raw)); got.plain != want {
			t.Fatalf("%q: plain %v, want %v", doc, got.plain, want)
		}
		if e := valid(doc).strEnd(start); e != end {
			t.Fatalf("%q: strEnd %d, want %d", doc, e, end)
		}
		if e := valid(doc).skip(start); e != end {
			t.Fatalf("%q: skip %d, want %d", doc, e, end)
		}
	}
}
