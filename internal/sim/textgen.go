package sim

import "math/rand/v2"

// vocabulary holds the words of generated text. Every word has at most three
// letters, so a word with its leading space is exactly one pseudo-token:
// text a client sends back tokenizes into the very tokens that were
// generated, and the cached reply blocks match the next turn.
var vocabulary = [...]string{
	"the", "of", "and", "to", "a", "in", "is", "it", "you", "he", "was", "for",
	"on", "are", "as", "his", "at", "be", "by", "one", "had", "not", "but", "all",
	"can", "her", "has", "him", "how", "its", "may", "new", "now", "old", "our", "out",
	"see", "two", "way", "who", "did", "get", "let", "put", "say", "she", "too", "use",
	"cat", "dog", "sun", "sky", "sea", "red", "big", "end", "far", "few", "key", "map",
	"net", "run", "set", "top",
}

// spaced holds the vocabulary with a leading space, built once.
var spaced = func() (s [len(vocabulary)]string) {
	for i, w := range vocabulary {
		s[i] = " " + w
	}
	return s
}()

// textGen produces the deterministic output of one request: the same seed
// and prompt always give the same words and the same length.
type textGen struct {
	rng   *rand.Rand
	first bool // the next word is the first and takes no leading space
}

// newTextGen seeds a generator with the worker seed and the prompt's hash.
// With spaceFirst the first word also gets a leading space, as a completion
// continues its prompt; a chat reply starts bare.
func newTextGen(seed int64, promptHash uint64, spaceFirst bool) *textGen {
	return &textGen{rng: rand.New(rand.NewPCG(uint64(seed), promptHash)), first: !spaceFirst}
}

// length decides how many tokens to produce and why the output ends. With
// ignoreEOS the output is exactly maxTokens long ("length"); otherwise a
// natural length is drawn from dist with the given mean (see
// Config.OutputLenDist) and the output stops there ("stop") when it comes
// before maxTokens.
func (g *textGen) length(maxTokens int, ignoreEOS bool, dist string, mean int) (n int, finish string) {
	if !ignoreEOS {
		var eos int
		switch dist {
		case OutputLenFixed:
			eos = mean
		case OutputLenUniform:
			eos = 1 + g.rng.IntN(2*mean-1)
		default: // OutputLenExponential
			eos = 1 + int(g.rng.ExpFloat64()*float64(mean-1))
		}
		if eos < maxTokens {
			return eos, "stop"
		}
	}
	return maxTokens, "length"
}

// next returns the next output token.
func (g *textGen) next() string {
	i := g.rng.IntN(len(vocabulary))
	if g.first {
		g.first = false
		return vocabulary[i]
	}
	return spaced[i]
}
