// Package prompt turns chat conversations and completion prompts into the
// token streams a simulated worker charges for.
//
// It has no tokenizer vocabulary. Text is cut into pseudo-tokens by a fixed,
// deterministic rule that yields about as many tokens as a BPE tokenizer does
// on English text, which is all the simulator needs: token counts drive every
// cost, and equal text always cuts into equal tokens, so prefix caching
// behaves as it does on a real model.
//
// The rule, applied left to right:
//   - a token holds at most 4 bytes and never splits a UTF-8 sequence
//     (a byte that does not start a valid sequence counts as one character);
//   - a space and '<' always start a new token, so words keep their leading
//     space (" the") and template markers ("<|user|>") begin cleanly;
//   - a newline is a token on its own.
//
// Because the cut depends only on bytes already seen plus one byte of
// look-ahead, two texts that share a prefix share every token of that prefix
// except possibly the last, and a text that ends with a newline tokenizes as
// a strict prefix of any longer text that starts with it.
package prompt

// maxTokenBytes is the largest number of bytes a pseudo-token holds.
const maxTokenBytes = 4

// Sequence is a token stream: the bytes of the text and the end offset of
// every token in it. Token i covers Text[Ends[i-1]:Ends[i]] (Ends[-1] = 0).
// The zero value is an empty sequence ready to use.
type Sequence struct {
	Text []byte
	Ends []int32
}

// Len returns the number of tokens in s.
func (s *Sequence) Len() int { return len(s.Ends) }

// Reset empties s, keeping its storage for reuse.
func (s *Sequence) Reset() {
	s.Text = s.Text[:0]
	s.Ends = s.Ends[:0]
}

// AppendText appends t to s and cuts it into tokens. The cut starts fresh at
// the join, so callers append at points where a token would start anyway
// (after a newline, or text that starts with a space or '<') to keep the
// stream equal to tokenizing the whole text at once.
func (s *Sequence) AppendText(t string) {
	start := len(s.Text)
	s.Text = append(s.Text, t...)
	s.Ends = appendEnds(s.Ends, s.Text, start)
}

// AppendToken appends t to s as exactly one token, whatever its length; it is
// how token-id prompts and generated tokens enter a stream.
func (s *Sequence) AppendToken(t string) {
	s.Text = append(s.Text, t...)
	s.Ends = append(s.Ends, int32(len(s.Text)))
}

// CountTokens returns the number of pseudo-tokens in text.
func CountTokens(text string) int {
	n := 0
	for i := 0; i < len(text); n++ {
		i = tokenEnd(text, i)
	}
	return n
}

// Tokenize returns the pseudo-tokens of text, for tests and documentation.
func Tokenize(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		j := tokenEnd(text, i)
		out = append(out, text[i:j])
		i = j
	}
	return out
}

// appendEnds tokenizes text[start:] and appends the token end offsets to ends.
func appendEnds(ends []int32, text []byte, start int) []int32 {
	for i := start; i < len(text); {
		i = tokenEnd(text, i)
		ends = append(ends, int32(i))
	}
	return ends
}

// tokenEnd returns the end offset of the token that starts at i (i < len(b)).
func tokenEnd[T string | []byte](b T, i int) int {
	if b[i] == '\n' {
		return i + 1
	}
	j := i + runeLen(b, i)
	for j < len(b) {
		c := b[j]
		if c == ' ' || c == '<' || c == '\n' {
			break
		}
		n := 1
		if c >= 0x80 {
			n = runeLen(b, j)
		}
		if j+n-i > maxTokenBytes {
			break
		}
		j += n
	}
	return j
}

// runeLen returns the byte length of the UTF-8 sequence that starts at i,
// or 1 when the bytes there are not a complete, well-formed lead plus
// continuation bytes.
func runeLen[T string | []byte](b T, i int) int {
	c := b[i]
	var n int
	switch {
	case c < 0x80:
		return 1
	case c&0xE0 == 0xC0:
		n = 2
	case c&0xF0 == 0xE0:
		n = 3
	case c&0xF8 == 0xF0:
		n = 4
	default:
		return 1
	}
	if i+n > len(b) {
		return 1
	}
	for k := 1; k < n; k++ {
		if b[i+k]&0xC0 != 0x80 {
			return 1
		}
	}
	return n
}
