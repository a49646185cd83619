package bench

import (
	"math/rand/v2"
	"strings"
)

// words are the vocabulary of generated text. Each has at most three letters, so a word with its
// leading space is one pseudo-token for the simulator (and about one token for a BPE tokenizer):
// a text of n words is about n tokens long.
var words = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "for", "on", "as", "at", "by", "be", "or",
	"an", "we", "if", "do", "no", "so", "up", "go", "my", "me", "us", "new", "use", "add",
	"fix", "run", "log", "api", "key", "map", "set", "get", "put", "let", "var", "int", "str",
	"err", "nil", "ok", "cfg", "env", "dir", "src", "pkg", "mod", "go", "sum", "row", "col",
	"id", "ref", "tag", "git", "dif", "hd", "tmp", "out", "in", "end", "top", "old", "bug",
	"why", "how", "all", "any", "one", "two", "ten", "max", "min", "len", "cap", "buf", "io",
	"net", "url", "tcp", "dns", "ssl", "tls", "db", "sql", "job", "cpu", "gpu", "ram", "rpc",
}

// wordText returns n space-separated words drawn from rng, each with a leading space.
func wordText(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 4)
	for range n {
		w := words[rng.IntN(len(words))]
		b.WriteByte(' ')
		b.WriteString(w)
	}
	return b.String()
}
