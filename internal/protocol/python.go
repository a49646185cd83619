package protocol

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// python.go writes a JSON value as Python's json.dumps writes what json.loads read from it, with
// the default options: ", " between elements, ": " after a key, every character outside printable
// ASCII escaped (\uXXXX, lowercase, UTF-16 surrogate pairs beyond the BMP, a lone surrogate escape
// kept as it was), a number with no fraction or exponent as an integer and any other as Python's
// repr of a float (1.0, 1e-05, 1e+16), a repeated key kept at its first place with its last value.
//
// vLLM's Anthropic Messages serving turns a tool_use block's input into the chat tool call's
// arguments string this way, so the router (to ask /tokenize for the very prompt vLLM renders,
// messages.go) and the simulator (to render as vLLM does) both need it. The value is read from a
// document the lexer accepted.

var (
	// errPythonSyntax is the error of a value Python does not read: invalid UTF-8 in a string,
	// or nesting deeper than its recursion limit (or, given to PythonJSON, malformed JSON).
	errPythonSyntax = errors.New("not a JSON value Python reads")
	// errPythonRange is the error of a number that Python reads as an infinite float.
	errPythonRange = errors.New("a number Python reads as an infinite float")
)

// maxPythonDepth bounds nesting, as Python's recursion limit does.
const maxPythonDepth = 1000

// PythonJSON returns raw, one JSON value, written as Python's json.dumps(json.loads(raw)) writes
// it, or an error for what json.loads refuses or reads as an infinite float.
func PythonJSON(raw []byte) (string, error) {
	s := scanner{data: raw}
	s.ws()
	start := s.pos
	s.skip(false)
	if s.ws(); s.err != nil || s.pos != len(raw) {
		return "", errPythonSyntax
	}
	b, err := appendPython(nil, valid(raw), start)
	return string(b), err
}

// appendPython appends the value at i as Python writes it.
func appendPython(dst []byte, v valid, i int) ([]byte, error) {
	var p pyValue
	if _, err := p.read(v, i, 0); err != nil {
		return dst, err
	}
	return p.appendTo(dst, v)
}

// pyValue is a value as Python holds it: where it is (for a scalar), or an object's keys as
// Python writes them and its members' values, or an array's elements.
type pyValue struct {
	kind  byte // '{', '[', or 0 for a scalar at pos
	pos   int
	keys  []string
	elems []pyValue
}

// read reads the value at i, nested depth deep, and returns the position after it.
func (p *pyValue) read(v valid, i, depth int) (int, error) {
	if depth > maxPythonDepth {
		return 0, errPythonSyntax
	}
	p.kind, p.pos = 0, i
	switch v[i] {
	case '[':
		p.kind = '['
		pos, more := v.first(i)
		for more {
			var e pyValue
			end, err := e.read(v, pos, depth+1)
			if err != nil {
				return 0, err
			}
			p.elems = append(p.elems, e)
			pos, more = v.next(end)
		}
		return pos, nil
	case '{':
		p.kind = '{'
		var at map[string]int // where each key is, once there are more than a few
		pos, more := v.first(i)
		for more {
			key, val := v.member(pos)
			k, ok := appendPythonString(nil, key.raw)
			if !ok {
				return 0, errPythonSyntax
			}
			var e pyValue
			end, err := e.read(v, val, depth+1)
			if err != nil {
				return 0, err
			}
			if j := p.keyIndex(at, k); j >= 0 {
				p.elems[j] = e // a dict keeps a repeated key where it was first set
			} else {
				p.keys = append(p.keys, string(k))
				p.elems = append(p.elems, e)
				if at != nil || len(p.keys) > 8 {
					at = p.index(at)
				}
			}
			pos, more = v.next(end)
		}
		return pos, nil
	}
	return v.skip(i), nil
}

// keyIndex is where the key k is among p's, or -1.
func (p *pyValue) keyIndex(at map[string]int, k []byte) int {
	if at != nil {
		if j, ok := at[string(k)]; ok {
			return j
		}
		return -1
	}
	for j, key := range p.keys {
		if key == string(k) {
			return j
		}
	}
	return -1
}

// index returns at with p's last key added, or a new index of all p's keys.
func (p *pyValue) index(at map[string]int) map[string]int {
	if at == nil {
		at = make(map[string]int, 2*len(p.keys))
		for j, k := range p.keys {
			at[k] = j
		}
		return at
	}
	at[p.keys[len(p.keys)-1]] = len(p.keys) - 1
	return at
}

// appendTo appends the value as Python writes it.
func (p *pyValue) appendTo(dst []byte, v valid) ([]byte, error) {
	switch p.kind {
	case '[':
		dst = append(dst, '[')
		for k := range p.elems {
			if k > 0 {
				dst = append(dst, ", "...)
			}
			var err error
			if dst, err = p.elems[k].appendTo(dst, v); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case '{':
		dst = append(dst, '{')
		for k := range p.elems {
			if k > 0 {
				dst = append(dst, ", "...)
			}
			dst = append(append(dst, p.keys[k]...), ": "...)
			var err error
			if dst, err = p.elems[k].appendTo(dst, v); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	}
	switch c := v[p.pos]; {
	case c == '"':
		j, _ := v.str(p.pos)
		b, ok := appendPythonString(dst, j.raw)
		if !ok {
			return dst, errPythonSyntax
		}
		return b, nil
	case c == '-' || isDigit(c):
		return appendPythonNumber(dst, v[p.pos:v.skip(p.pos)])
	}
	return append(dst, v[p.pos:v.skip(p.pos)]...), nil // true, false, null
}

// appendPythonNumber appends the number lit as Python writes what it reads: an integer as it is
// (Python's int has no negative zero), anything else as the repr of a float.
func appendPythonNumber(dst, lit []byte) ([]byte, error) {
	if bytes.IndexAny(lit, ".eE") < 0 {
		if string(lit) == "-0" {
			return append(dst, '0'), nil
		}
		return append(dst, lit...), nil
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil || math.IsInf(f, 0) {
		return dst, errPythonRange
	}
	return append(dst, floatRepr(f)...), nil
}

// floatRepr is Python's repr of f: the shortest digits that read back as f, in positional
// notation with at least one digit after the point when the decimal point falls within 16
// digits of the first, else as d[.ddd]e±XX.
func floatRepr(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	neg := e[0] == '-'
	if neg {
		e = e[1:]
	}
	mant, exp, _ := strings.Cut(e, "e")
	x, _ := strconv.Atoi(exp)
	digits := strings.Replace(mant, ".", "", 1)
	point := x + 1 // the decimal point's place, counted from the first digit
	var out string
	switch {
	case point > 16 || point <= -4:
		sign := "+"
		if x < 0 {
			sign, x = "-", -x
		}
		ex := strconv.Itoa(x)
		if len(ex) < 2 {
			ex = "0" + ex
		}
		out = mant + "e" + sign + ex
	case point <= 0:
		out = "0." + strings.Repeat("0", -point) + digits
	case point >= len(digits):
		out = digits + strings.Repeat("0", point-len(digits)) + ".0"
	default:
		out = digits[:point] + "." + digits[point:]
	}
	if neg {
		out = "-" + out
	}
	return out
}

// appendPythonString appends the JSON string whose validated contents are raw as Python writes
// the string json.loads reads from it; ok is false when raw holds invalid UTF-8, which Python
// does not read.
func appendPythonString(dst, raw []byte) (_ []byte, ok bool) {
	dst = append(dst, '"')
	for k := 0; k < len(raw); {
		switch c := raw[k]; {
		case c == '\\' && raw[k+1] == 'u':
			dst = appendPythonUnit(dst, uint16(hex4(raw[k+2:])))
			k += 6
		case c == '\\':
			dst = appendPythonUnit(dst, uint16(unescape(raw[k+1])))
			k += 2
		case c < utf8.RuneSelf:
			dst = appendPythonUnit(dst, uint16(c))
			k++
		default:
			r, size := utf8.DecodeRune(raw[k:])
			if r == utf8.RuneError && size <= 1 {
				return dst, false
			}
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				dst = appendPythonUnit(appendPythonUnit(dst, uint16(r1)), uint16(r2))
			} else {
				dst = appendPythonUnit(dst, uint16(r))
			}
			k += size
		}
	}
	return append(dst, '"'), true
}

// appendPythonUnit appends one UTF-16 code unit of a string as Python's json.dumps writes it.
func appendPythonUnit(dst []byte, u uint16) []byte {
	const hexDigits = "0123456789abcdef"
	switch {
	case u == '"':
		return append(dst, `\"`...)
	case u == '\\':
		return append(dst, `\\`...)
	case u == '\n':
		return append(dst, `\n`...)
	case u == '\r':
		return append(dst, `\r`...)
	case u == '\t':
		return append(dst, `\t`...)
	case u == '\b':
		return append(dst, `\b`...)
	case u == '\f':
		return append(dst, `\f`...)
	case u >= ' ' && u <= '~':
		return append(dst, byte(u))
	}
	return append(dst, '\\', 'u', hexDigits[u>>12], hexDigits[u>>8&0xF], hexDigits[u>>4&0xF], hexDigits[u&0xF])
}
