package protocol

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// The wants are what CPython's json.dumps(json.loads(in)) prints.
func TestPythonJSONWritesWhatPythonWrites(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{}`, `{}`},
		{`[]`, `[]`},
		{` {"city":"Paris","unit":"celsius"} `, `{"city": "Paris", "unit": "celsius"}`},
		{`[true,false,null,{"k":{}}]`, `[true, false, null, {"k": {}}]`},
		{`{"a":1,"b":2,"a":"x"}`, `{"a": "x", "b": 2}`},
		{`{"a":1,"\u0061":2}`, `{"a": 2}`},
		{`{"\ud800":1,"\udbff":2}`, `{"\ud800": 1, "\udbff": 2}`},
		{`[1.0,2.5e-7,1e16,1e15,-0,-0.0,0.0001,1E2,0.1,1e-320]`, `[1.0, 2.5e-07, 1e+16, 1000000000000000.0, 0, -0.0, 0.0001, 100.0, 0.1, 1e-320]`},
		{`[123456789012345678901234567890,1.5e300,12345678901234567.0,-12.75]`, `[123456789012345678901234567890, 1.5e+300, 1.2345678901234568e+16, -12.75]`},
		{`"h\u00e9\ud800 \ud83d\ude00 é \u007f \/ <>&"`, `"h\u00e9\ud800 \ud83d\ude00 \u00e9 \u007f / <>&"`},
		{`"tab\tnl\nquote\"back\\ctl\u0001"`, `"tab\tnl\nquote\"back\\ctl\u0001"`},
		{`"日本"`, `"\u65e5\u672c"`},
		{strings.Repeat("[", 1000) + strings.Repeat("]", 1000), strings.Repeat("[", 1000) + strings.Repeat("]", 1000)},
	}
	for _, tt := range tests {
		got, err := PythonJSON([]byte(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("PythonJSON(%.80s) = %.80s, %v; want %.80s", tt.in, got, err, tt.want)
		}
	}
}

func TestPythonJSONRefusesWhatPythonRefuses(t *testing.T) {
	for _, in := range []string{``, `{`, `[1,]`, `{"a"}`, `01`, `1.`, `-`, `"a`, "\"\xff\"", "{\"\xff\":1}", `nul`, `[1] 2`, `"\x"`, "\"a\nb\"",
		strings.Repeat("[", 1001) + "1" + strings.Repeat("]", 1001)} {
		if got, err := PythonJSON([]byte(in)); !errors.Is(err, errPythonSyntax) {
			t.Errorf("PythonJSON(%.40q) = %q, %v; want errPythonSyntax", in, got, err)
		}
	}
	if _, err := PythonJSON([]byte(`[1e400]`)); !errors.Is(err, errPythonRange) {
		t.Errorf("1e400: %v, want errPythonRange (Python reads it as inf)", err)
	}
}

// FuzzPythonJSON: a value in valid UTF-8 that encoding/json reads and that nests less deeply than
// Python's limit is written, in ASCII, as a value encoding/json reads back as the same value
// (Python's spelling of numbers and escapes aside); whatever else is refused.
func FuzzPythonJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5,{"b":null}],"a":"x"}`, `"\ud800\u00e9"`, `[1e400]`, `-0`, "\"\xff\"", `{"k":"v"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := PythonJSON(in)
		var want any
		readable := json.Unmarshal(in, &want) == nil && utf8.Valid(in) && nesting(in) <= maxPythonDepth
		switch {
		case err != nil && readable:
			t.Fatalf("PythonJSON(%q) refused a value Python reads: %v", in, err)
		case err != nil:
			return
		case !readable && json.Valid(in) && utf8.Valid(in) && nesting(in) <= maxPythonDepth:
			return // a number encoding/json does not read into a float64, which Python reads as an int
		case !readable:
			t.Fatalf("PythonJSON(%q) = %q: wrote a value Python does not read", in, out)
		}
		var got any
		if err := json.Unmarshal([]byte(out), &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("PythonJSON(%q) = %q, which reads as %v (%v), want %v", in, out, got, err, want)
		}
		for i := range len(out) {
			if out[i] >= utf8.RuneSelf {
				t.Fatalf("PythonJSON(%q) = %q: not ASCII", in, out)
			}
		}
	})
}

// nesting is how deep the containers of the JSON text in nest.
func nesting(in []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(in); i++ {
		switch c := in[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case !inString && (c == '[' || c == '{'):
			depth++
			deepest = max(deepest, depth)
		case !inString && (c == ']' || c == '}'):
			depth--
		}
	}
	return deepest
}
