package clientkeys

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

const benchKeys = 10_000

// benchFile returns a keys file of n entries spread over 10 tenants and 3 priorities, every
// other one given as a digest, and the plaintext keys.
func benchFile(n int) (string, []string) {
	var b strings.Builder
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("sk-bench-%08d-0123456789abcdef0123456789", i)
		entry := keys[i]
		if i%2 == 1 {
			entry = "sha256:" + digestOf(keys[i])
		}
		fmt.Fprintf(&b, "%s tenant=tenant-%d priority=p%d\n", entry, i%10, i%3)
	}
	return b.String(), keys
}

// benchHits times lookup on keys, in turn, every one of which it must find: the hit path of a
// key set and of a watcher over the same set.
func benchHits(b *testing.B, lookup func(string) (Client, bool), keys []string) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := lookup(keys[i%len(keys)]); !ok {
			b.Fatal("miss")
		}
		i++
	}
}

func BenchmarkLookup(b *testing.B) {
	text, keys := benchFile(benchKeys)
	s, err := Parse("bench", []byte(text))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hit", func(b *testing.B) { benchHits(b, s.Lookup, keys) })
	b.Run("miss", func(b *testing.B) {
		b.ReportAllocs()
		wrong := "sk-bench-99999999-0123456789abcdef0123456789"
		for b.Loop() {
			if _, ok := s.Lookup(wrong); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("watcher", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "keys")
		writeFile(b, path, text)
		w, err := NewWatcher(path, WatcherOptions{})
		if err != nil {
			b.Fatal(err)
		}
		benchHits(b, w.Lookup, keys)
	})
}

func BenchmarkLoad(b *testing.B) {
	text, _ := benchFile(benchKeys)
	path := filepath.Join(b.TempDir(), "keys")
	writeFile(b, path, text)
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := Load(path); err != nil {
			b.Fatal(err)
		}
	}
}
