package pyjson

import (
	"errors"
	"testing"
)

// The wants are what CPython's json.dumps(json.loads(in)) prints.
func TestDumpsWritesWhatPythonWrites(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{}`, `{}`},
		{`[]`, `[]`},
		{` {"city":"Paris","unit":"celsius"} `, `{"city": "Paris", "unit": "celsius"}`},
		{`[true,false,null,{"k":{}}]`, `[true, false, null, {"k": {}}]`},
		{`{"a":1,"b":2,"a":"x"}`, `{"a": "x", "b": 2}`},
		{`{"a":1,"\u0061":2}`, `{"a": 2}`},
		{`[1.0,2.5e-7,1e16,1e15,-0,-0.0,0.0001,1E2,0.1,1e-320]`, `[1.0, 2.5e-07, 1e+16, 1000000000000000.0, 0, -0.0, 0.0001, 100.0, 0.1, 1e-320]`},
		{`[123456789012345678901234567890,1.5e300,12345678901234567.0,-12.75]`, `[123456789012345678901234567890, 1.5e+300, 1.2345678901234568e+16, -12.75]`},
		{`"h\u00e9\ud800 \ud83d\ude00 é \u007f \/ <>&"`, `"h\u00e9\ud800 \ud83d\ude00 \u00e9 \u007f / <>&"`},
		{`"tab\tnl\nquote\"back\\ctl\u0001"`, `"tab\tnl\nquote\"back\\ctl\u0001"`},
		{`"日本"`, `"\u65e5\u672c"`},
	}
	for _, tt := range tests {
		got, err := Dumps([]byte(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("Dumps(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestDumpsRefusesWhatPythonRefuses(t *testing.T) {
	for _, in := range []string{``, `{`, `[1,]`, `{"a"}`, `01`, `1.`, `-`, `"a`, "\"\xff\"", `nul`, `[1] 2`, `"\x"`, "\"a\nb\""} {
		if got, err := Dumps([]byte(in)); !errors.Is(err, ErrSyntax) {
			t.Errorf("Dumps(%q) = %q, %v; want ErrSyntax", in, got, err)
		}
	}
	if _, err := Dumps([]byte(`[1e400]`)); !errors.Is(err, ErrRange) {
		t.Errorf("1e400: %v, want ErrRange (Python reads it as inf)", err)
	}
}
