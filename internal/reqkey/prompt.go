package reqkey

import "strconv"

// prompt.go renders the routing text of completion and generate requests from their prompt, the
// way the history key is written: measured first, then written into a builder of its exact size.

// routingText is what non-chat requests are matched on: /generate's text, prompt or input_ids, or
// the completion prompt (strings joined by newlines, token ids rendered as their decimal values).
func routingText(b *body) string {
	for _, raw := range [][]byte{b.text, b.prompt, b.inputIDs} {
		if raw == nil {
			continue
		}
		var size keyWriter
		renderPrompt(&size, valid(raw), 0)
		if size.n == 0 {
			continue
		}
		w := writerOf(size.n)
		renderPrompt(&w, valid(raw), 0)
		return w.string()
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
