package tokenize

import (
	"errors"
	"fmt"
)

// answer.go reads an engine's /tokenize answer, {"count":N,"max_model_len":M,"tokens":[...]},
// for its tokens alone, in one pass over the bytes: a prompt of 100k tokens is an answer of
// about 600 KB, which encoding/json took 8 ms to decode into a slice, most of a request's time
// in the router. The other members are skipped, whatever JSON they hold.

var errAnswer = errors.New("/tokenize answer is not an object with a tokens array")

// parseTokens returns the tokens of the answer b. A token must be an integer from 0 to 2^32-1;
// an answer without tokens, with tokens twice, or not a JSON object, is an error. capHint sizes the slice.
func parseTokens(b []byte, capHint int) ([]uint32, error) {
	p := answerParser{b: b}
	p.space()
	if !p.eat('{') {
		return nil, errAnswer
	}
	var tokens []uint32
	found := false
	for {
		p.space()
		key, ok := p.str()
		if !ok {
			return nil, errAnswer
		}
		if p.space(); !p.eat(':') {
			return nil, errAnswer
		}
		p.space()
		if key == "tokens" {
			if found {
				return nil, errAnswer // which one the engine meant is not ours to guess
			}
			var err error
			if tokens, err = p.tokens(capHint); err != nil {
				return nil, err
			}
			found = true
		} else if !p.skip(0) {
			return nil, errAnswer
		}
		if p.space(); p.eat('}') {
			break
		}
		if !p.eat(',') {
			return nil, errAnswer
		}
	}
	if p.space(); p.i != len(p.b) || !found {
		return nil, errAnswer
	}
	return tokens, nil
}

type answerParser struct {
	b []byte
	i int
}

func (p *answerParser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *answerParser) eat(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

func (p *answerParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\n' || p.b[p.i] == '\r' || p.b[p.i] == '\t') {
		p.i++
	}
}

// str reads a string and returns its raw bytes (escapes left as they are: the one key compared,
// "tokens", has none).
func (p *answerParser) str() (string, bool) {
	if !p.eat('"') {
		return "", false
	}
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c == '\\':
			p.i += 2
		case c < 0x20:
			return "", false
		default:
			p.i++
		}
	}
	return "", false
}

// tokens reads an array of integers from 0 to 2^32-1.
func (p *answerParser) tokens(capHint int) ([]uint32, error) {
	if !p.eat('[') {
		return nil, errAnswer
	}
	out := make([]uint32, 0, capHint)
	if p.space(); p.eat(']') {
		return out, nil
	}
	for {
		p.space()
		start := p.i
		var v uint64
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			v = v*10 + uint64(p.b[p.i]-'0')
			if v > 1<<32-1 {
				return nil, fmt.Errorf("/tokenize answer: token %s... out of range", p.b[start:p.i+1])
			}
			p.i++
		}
		if p.i == start || (p.i-start > 1 && p.b[start] == '0') {
			return nil, errAnswer
		}
		out = append(out, uint32(v))
		p.space()
		if p.eat(']') {
			return out, nil
		}
		if !p.eat(',') {
			return nil, errAnswer
		}
	}
}

// maxDepth bounds the nesting of a skipped value.
const maxDepth = 64

// skip passes over one JSON value of any kind, checking its shape loosely (its strings end,
// its brackets match), at most maxDepth deep.
func (p *answerParser) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch c := p.peek(); {
	case c == '"':
		_, ok := p.str()
		return ok
	case c == '{' || c == '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		p.i++
		if p.space(); p.eat(end) {
			return true
		}
		for {
			p.space()
			if c == '{' {
				if _, ok := p.str(); !ok {
					return false
				}
				if p.space(); !p.eat(':') {
					return false
				}
				p.space()
			}
			if !p.skip(depth + 1) {
				return false
			}
			if p.space(); p.eat(end) {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	default: // a number or a literal
		start := p.i
		for p.i < len(p.b) && (p.b[p.i] == '-' || p.b[p.i] == '+' || p.b[p.i] == '.' ||
			(p.b[p.i] >= '0' && p.b[p.i] <= '9') || (p.b[p.i] >= 'a' && p.b[p.i] <= 'z') || p.b[p.i] == 'E') {
			p.i++
		}
		return p.i > start
	}
}
