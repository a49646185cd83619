package protocol

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// canonicalOf writes the canonical form of the JSON value raw, and checks that measuring it
// gives its length, and that it is within the bound the lexer finds for it.
func canonicalOf(t *testing.T, raw []byte) string {
	t.Helper()
	s := scanner{data: raw}
	s.skip(true)
	c := canonicalizer{v: valid(raw), recs: make([]member, 0, s.keys)}
	var size keyWriter
	c.write(&size, 0)
	w := writerOf(size.n)
	c.write(&w, 0)
	if size.n != len(w.buf) || cap(w.buf) != size.n {
		t.Fatalf("%s: measured %d bytes, wrote %d", raw, size.n, len(w.buf))
	}
	if cap(c.recs) != s.keys {
		t.Fatalf("%s: %d members recorded, over the %d keys the lexer counted", raw, cap(c.recs), s.keys)
	}
	if bound := len(raw) + s.grow + maxFloatLen*s.floats; s.err == nil && len(w.buf) > bound {
		t.Fatalf("%s: wrote %d bytes, over the bound of %d", raw, len(w.buf), bound)
	}
	return w.string()
}

// No number is longer in canonical form than maxFloatLen, which the key's bound allows each.
func TestCanonicalNumbersFitMaxFloatLen(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(n string) {
		t.Helper()
		var w keyWriter
		number(&w, []byte(n))
		if w.n > maxFloatLen {
			t.Fatalf("%s is %d bytes in canonical form, over %d", n, w.n, maxFloatLen)
		}
	}
	for _, n := range []string{"-1.2345678901234567e-7", "-0.0000012345678901234567", "-9.999999999999999e20",
		"-1.7976931348623157e308", "-2.2250738585072014e-308", "-5e-324", "-123456789012345678901234567890"} {
		check(n)
	}
	for range 200000 {
		// Any bits, and the 17 digits of a random mantissa at every exponent near the switch
		// between the two formats, where the digits are written out.
		if f := math.Float64frombits(r.Uint64()); !math.IsNaN(f) && !math.IsInf(f, 0) {
			check(strconv.FormatFloat(f, 'g', -1, 64))
		}
		check(strconv.FormatFloat(-(1+r.Float64())*math.Pow10(r.IntN(32)-10), 'g', -1, 64))
	}
}

func canonicalSeeds(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":{"d":[1,2,{"z":null,"y":true}],"c":"x"},"a":{"e":false}}`,
		`["\u2028\u2029\u0001\"\\\/\b\f\n\r\t<>&\ud83d\ude00\ud800 \udc00\ud800\u0041","é","` + "\xff\xe2\x80\xa8" + `"]`,
		`[1e-7,1e21,1e20,-0,-0.0,0.000001,123456789012345,1234567890123456,1.0,1E2,2.5e-10,5e-324]`,
		`{"\u0061":1,"a":2,"\u00e9":3,"` + "\xc3\xa9" + `":4,"` + "\xff" + `":5,"\ufffd":6,"":7,"a\u0000":8}`,
		`{"z":{},"y":[],"x":[{}],"w":[[]]}`,
		`null`,
		`"s"`,
		` {"a" : [ 1 , 2 ] } `,
	} {
		f.Add([]byte(s))
	}
}

// FuzzCanonicalMatchesEncodingJSON: the canonical form written in place from a valid JSON value
// is the one encoding/json writes for the value it decodes into `any`.
func FuzzCanonicalMatchesEncodingJSON(f *testing.F) {
	canonicalSeeds(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		raw = bytes.Trim(raw, " \t\r\n")
		var v any
		if !json.Valid(raw) || json.Unmarshal(raw, &v) != nil {
			return // invalid, or a number that does not fit a float64: Parse rejects those
		}
		if got, want := canonicalOf(t, raw), string(canonicalJSON(raw, false)); got != want {
			t.Fatalf("%s:\n got  %s\n want %s", raw, got, want)
		}
	})
}

// A value too long for the positions a member holds is written by way of encoding/json, into the
// same key.
func TestHistoryKeyCanonicalFormOfTooLongValues(t *testing.T) {
	body := []byte(`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"b":[1.50,"\u00e9"],"a":{}}}}]}],` +
		`"tools":[{"function":{"name":"f","parameters":{"z":1,"a":{"y":2,"x":3}}}}]}`)
	want, err := ParseChat(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	defer func(limit int) { compactLimit = limit }(compactLimit)
	compactLimit = 0
	got, err := ParseChat(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	if Routing(got) != Routing(want) {
		t.Errorf("the key changed with values written by way of encoding/json:\n%q\n%q", got.Text, want.Text)
	}
	if !strings.Contains(got.Text, `{"a":{},"b":[1.5,"é"]}`) || !strings.Contains(got.Text, `{"a":{"x":3,"y":2},"z":1}`) {
		t.Errorf("key %q does not hold the canonical values", got.Text)
	}
}
