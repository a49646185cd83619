// Package pyjson writes a JSON value as Python's json.dumps writes what json.loads read from it,
// with the default options: ", " between elements, ": " after a key, every character outside
// printable ASCII escaped (\uXXXX, lowercase, UTF-16 surrogate pairs beyond the BMP), a number
// with no fraction or exponent as an integer and any other as Python's repr of a float (1.0,
// 1e-05, 1e+16), a repeated key kept at its first place with its last value.
//
// vLLM's Anthropic Messages serving turns a tool_use block's input into the chat tool call's
// arguments string this way, so the router (to ask /tokenize for the very prompt vLLM renders)
// and the simulator (to render as vLLM does) both need it.
package pyjson

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrSyntax is returned for input that is not one well-formed JSON value in valid UTF-8.
var ErrSyntax = errors.New("pyjson: not a well-formed JSON value")

// ErrRange is returned for a number that Python reads as an infinite float.
var ErrRange = errors.New("pyjson: number out of float range")

// maxDepth bounds nesting, as Python's recursion limit does; deeper input is an ErrSyntax.
const maxDepth = 1000

// Dumps returns raw written as json.dumps(json.loads(raw)) writes it.
func Dumps(raw []byte) (string, error) {
	d := decoder{in: raw}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return "", err
	}
	d.space()
	if d.pos != len(d.in) {
		return "", ErrSyntax
	}
	var b strings.Builder
	b.Grow(len(raw) + len(raw)/8)
	v.write(&b)
	return b.String(), nil
}

// value is a decoded JSON value: an object's members in first-seen order, an array's elements,
// or a scalar already in its output form (a string's UTF-16 code units are kept, so a lone
// surrogate written as an escape comes out as Python writes it).
type value struct {
	kind   byte // '{', '[', '"', or 0 for a literal written as lit
	lit    string
	units  []uint16 // a string's code units
	keys   []value  // an object's keys, each a string
	elems  []value  // an object's values (parallel to keys) or an array's elements
	simple bool     // a string made of printable ASCII only: lit holds it as is
}

type decoder struct {
	in  []byte
	pos int
}

func (d *decoder) space() {
	for d.pos < len(d.in) {
		switch d.in[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (value, error) {
	if depth > maxDepth || d.pos >= len(d.in) {
		return value{}, ErrSyntax
	}
	switch c := d.in[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if strings.HasPrefix(string(d.in[d.pos:min(len(d.in), d.pos+5)]), lit) {
			d.pos += len(lit)
			return value{lit: lit}, nil
		}
	}
	return value{}, ErrSyntax
}

func (d *decoder) object(depth int) (value, error) {
	v := value{kind: '{'}
	d.pos++
	d.space()
	if d.pos < len(d.in) && d.in[d.pos] == '}' {
		d.pos++
		return v, nil
	}
	at := map[string]int{}
	for {
		d.space()
		if d.pos >= len(d.in) || d.in[d.pos] != '"' {
			return value{}, ErrSyntax
		}
		k, err := d.str()
		if err != nil {
			return value{}, err
		}
		d.space()
		if d.pos >= len(d.in) || d.in[d.pos] != ':' {
			return value{}, ErrSyntax
		}
		d.pos++
		d.space()
		e, err := d.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		name := string(utf16.Decode(k.units))
		if k.simple {
			name = k.lit
		}
		if i, ok := at[name]; ok {
			v.elems[i] = e // a dict keeps a repeated key where it was first set
		} else {
			at[name] = len(v.keys)
			v.keys = append(v.keys, k)
			v.elems = append(v.elems, e)
		}
		if done, err := d.after('}'); done || err != nil {
			return v, err
		}
	}
}

func (d *decoder) array(depth int) (value, error) {
	v := value{kind: '['}
	d.pos++
	d.space()
	if d.pos < len(d.in) && d.in[d.pos] == ']' {
		d.pos++
		return v, nil
	}
	for {
		d.space()
		e, err := d.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		v.elems = append(v.elems, e)
		if done, err := d.after(']'); done || err != nil {
			return v, err
		}
	}
}

// after reads what follows a member or element: a comma, or close, which ends the container
// (done). Anything else is ErrSyntax.
func (d *decoder) after(close byte) (done bool, err error) {
	d.space()
	if d.pos >= len(d.in) {
		return false, ErrSyntax
	}
	switch d.in[d.pos] {
	case ',':
		d.pos++
		return false, nil
	case close:
		d.pos++
		return true, nil
	}
	return false, ErrSyntax
}

// str reads a string at d.pos (its opening quote).
func (d *decoder) str() (value, error) {
	d.pos++
	start := d.pos
	simple := true
	for i := d.pos; i < len(d.in); i++ {
		c := d.in[i]
		if c == '"' {
			if simple {
				d.pos = i + 1
				return value{kind: '"', lit: string(d.in[start:i]), simple: true}, nil
			}
			break
		}
		if c < ' ' || c > '~' || c == '\\' {
			simple = false
			break
		}
	}
	var units []uint16
	for {
		if d.pos >= len(d.in) {
			return value{}, ErrSyntax
		}
		c := d.in[d.pos]
		switch {
		case c == '"':
			d.pos++
			return value{kind: '"', units: units}, nil
		case c < ' ':
			return value{}, ErrSyntax
		case c == '\\':
			if d.pos+1 >= len(d.in) {
				return value{}, ErrSyntax
			}
			e := d.in[d.pos+1]
			d.pos += 2
			switch e {
			case '"', '\\', '/':
				units = append(units, uint16(e))
			case 'b':
				units = append(units, '\b')
			case 'f':
				units = append(units, '\f')
			case 'n':
				units = append(units, '\n')
			case 'r':
				units = append(units, '\r')
			case 't':
				units = append(units, '\t')
			case 'u':
				if d.pos+4 > len(d.in) {
					return value{}, ErrSyntax
				}
				n, err := strconv.ParseUint(string(d.in[d.pos:d.pos+4]), 16, 16)
				if err != nil {
					return value{}, ErrSyntax
				}
				units = append(units, uint16(n))
				d.pos += 4
			default:
				return value{}, ErrSyntax
			}
		case c < utf8.RuneSelf:
			units = append(units, uint16(c))
			d.pos++
		default:
			r, n := utf8.DecodeRune(d.in[d.pos:])
			if r == utf8.RuneError && n <= 1 {
				return value{}, ErrSyntax
			}
			units = utf16.AppendRune(units, r)
			d.pos += n
		}
	}
}

// number reads a number at d.pos into its output form.
func (d *decoder) number() (value, error) {
	start := d.pos
	if d.in[d.pos] == '-' {
		d.pos++
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.in) && d.in[d.pos] >= '0' && d.in[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	intStart := d.pos
	if n := digits(); n == 0 || (n > 1 && d.in[intStart] == '0') {
		return value{}, ErrSyntax
	}
	isFloat := false
	if d.pos < len(d.in) && d.in[d.pos] == '.' {
		d.pos++
		if digits() == 0 {
			return value{}, ErrSyntax
		}
		isFloat = true
	}
	if d.pos < len(d.in) && (d.in[d.pos] == 'e' || d.in[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.in) && (d.in[d.pos] == '+' || d.in[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return value{}, ErrSyntax
		}
		isFloat = true
	}
	lit := string(d.in[start:d.pos])
	if !isFloat {
		if lit == "-0" {
			lit = "0" // Python's int has no negative zero
		}
		return value{lit: lit}, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return value{}, ErrRange
	}
	return value{lit: floatRepr(f)}, nil
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

const hexDigits = "0123456789abcdef"

func (v *value) write(b *strings.Builder) {
	switch v.kind {
	case 0:
		b.WriteString(v.lit)
	case '"':
		b.WriteByte('"')
		if v.simple {
			b.WriteString(v.lit)
		} else {
			for _, u := range v.units {
				switch {
				case u == '"':
					b.WriteString(`\"`)
				case u == '\\':
					b.WriteString(`\\`)
				case u == '\n':
					b.WriteString(`\n`)
				case u == '\r':
					b.WriteString(`\r`)
				case u == '\t':
					b.WriteString(`\t`)
				case u == '\b':
					b.WriteString(`\b`)
				case u == '\f':
					b.WriteString(`\f`)
				case u >= ' ' && u <= '~':
					b.WriteByte(byte(u))
				default:
					b.WriteString(`\u`)
					b.WriteByte(hexDigits[u>>12])
					b.WriteByte(hexDigits[u>>8&0xF])
					b.WriteByte(hexDigits[u>>4&0xF])
					b.WriteByte(hexDigits[u&0xF])
				}
			}
		}
		b.WriteByte('"')
	case '[':
		b.WriteByte('[')
		for i := range v.elems {
			if i > 0 {
				b.WriteString(", ")
			}
			v.elems[i].write(b)
		}
		b.WriteByte(']')
	case '{':
		b.WriteByte('{')
		for i := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			v.keys[i].write(b)
			b.WriteString(": ")
			v.elems[i].write(b)
		}
		b.WriteByte('}')
	}
}
