package protocol

import (
	"strconv"

	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// completions.go reads the bodies of the OpenAI completions API (POST /v1/completions) and of
// /generate, with the reader of chat bodies (chat.go), and renders their routing text from their
// prompt the way the history key is written: in one pass, into a buffer the size of a bound the
// lexer found for it, or, when the bound is more than twice the body (a prompt of many numbers not
// written as they are), measured first, then written into a buffer of its exact size.

// The endpoints of the completions API and of /generate.
const (
	CompletionsPath = "/v1/completions"
	GeneratePath    = "/generate"
)

// ParseCompletions reads a completion body (POST /v1/completions) with the reader of chat bodies
// (see ParseChat). Its /tokenize query is its prompt, when that is one string.
func ParseCompletions(h reqkey.Header, raw []byte) (*Request, error) {
	return parseBody(h, raw, completionQuery)
}

// ParseGenerate reads a /generate body with the reader of chat bodies (see ParseChat). It is not
// tokenized.
func ParseGenerate(h reqkey.Header, raw []byte) (*Request, error) {
	return parseBody(h, raw, notTokenized)
}

// renderCompletion writes a completion's prompt when it is one string (null asks for the empty
// one), with its own add_special_tokens; a list of prompts (a batch) or of token ids is not asked.
func renderCompletion(q *query) bool {
	prompt, special, bad := 0, 0, false
	q.topLevel(func(key []byte, val int) {
		switch string(key) {
		case "prompt":
			prompt = val
		case "add_special_tokens":
			if c := q.v[val]; c == 't' || c == 'f' || c == 'n' {
				special = val
			} else {
				bad = true // an engine refuses it
			}
		}
	})
	if prompt == 0 || bad {
		return false
	}
	q.out = append(q.out, `,"prompt":`...)
	switch q.v[prompt] {
	case '"':
		j, _ := q.v.str(prompt)
		q.out = q.appendJstr(q.out, j)
	case 'n':
		q.out = append(q.out, `""`...)
	default:
		return false
	}
	if special != 0 && q.v[special] != 'n' {
		q.out = append(q.out, `,"add_special_tokens":`...)
		if q.v[special] == 't' {
			q.out = append(q.out, "true"...)
		} else {
			q.out = append(q.out, "false"...)
		}
	}
	return true
}

// prompt is a free-form value that may be rendered as routing text: its raw JSON, nil for null,
// and a bound on its rendering's size. Separators take the place of commas, and strings lose
// their quotes: a rendering is no longer than the value but for what decoding adds to strings
// (see scanner.grow) and numbers not written as they are, which take at most
// maxRenderedFloatLen bytes.
type prompt struct {
	raw  []byte
	size int
}

// maxRenderedFloatLen is the longest rendering of a number (see renderPrompt): a sign, "0.", 323
// zeros and the digit of the smallest float64, 5e-324.
const maxRenderedFloatLen = 327

// routingText is what non-chat requests are matched on: /generate's text, prompt or input_ids, or
// the completion prompt (strings joined by newlines, token ids rendered as their decimal values).
// limit is the largest bound under which the text is written in one pass.
func routingText(b *body, room keyRoom) string {
	for _, p := range []prompt{b.text, b.prompt, b.inputIDs} {
		if p.raw == nil {
			continue
		}
		size := p.size
		if size > room.limit {
			var count keyWriter
			renderPrompt(&count, valid(p.raw), 0)
			size = count.n
		}
		if size == 0 {
			continue
		}
		w := room.writer(size)
		if renderPrompt(&w, valid(p.raw), 0); w.n > 0 {
			return w.string()
		}
	}
	return ""
}

// renderPrompt writes the prompt value at i, which has been validated, and returns the position
// after it: a string as it is, a number in decimal, an array as its elements separated by a space
// before a number and a newline before anything else. Other values write nothing.
func renderPrompt(w *keyWriter, v valid, i int) int {
	switch c := v[i]; {
	case c == '"':
		s, end := v.str(i)
		w.value(s)
		return end
	case c == '-' || isDigit(c):
		end := i
		for end < len(v) && !delimiter[v[end]] {
			end++
		}
		if n := v[i:end]; exactInt(n) {
			w.write(n) // a float64 holds it exactly, and FormatFloat writes it back as it is
		} else {
			f, _ := strconv.ParseFloat(string(n), 64)
			var buf [32]byte
			w.write(strconv.AppendFloat(buf[:0], f, 'f', -1, 64))
		}
		return end
	case c == '[':
		pos, more := v.first(i)
		for n := 0; more; n++ {
			if n > 0 {
				if c := v[pos]; c == '-' || isDigit(c) {
					w.byte(' ')
				} else {
					w.byte('\n')
				}
			}
			pos, more = v.next(renderPrompt(w, v, pos))
		}
		return pos
	}
	return v.skip(i)
}

// prompt reads a free-form value that may be rendered as routing text (see routingText).
func (s *scanner) prompt(name string) prompt {
	grow, floats := s.grow, s.floats
	raw := s.freeForm(name)
	return prompt{raw: raw, size: len(raw) + s.grow - grow + maxRenderedFloatLen*(s.floats-floats)}
}
