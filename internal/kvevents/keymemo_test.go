package kvevents

import (
	"slices"
	"sync"
	"testing"
)

// turnTokens is a conversation's tokens after turn t: each turn appends 3.5 blocks.
func turnTokens(conversation, t int) []uint32 {
	ts := make([]uint32, (t+1)*7*bs/2)
	for i := range ts {
		ts[i] = uint32(conversation)<<20 + uint32(i)
	}
	return ts
}

// The memo must give exactly Keys' keys, whatever it remembers: a turn that extends an earlier
// one, the same prompt again, another conversation, an adapter, a salt, another block size.
func TestKeyMemoGivesTheKeysKeysGives(t *testing.T) {
	var m KeyMemo
	for _, c := range []struct {
		lora, salt string
		tokens     []uint32
		bs         int
	}{
		{"", "", turnTokens(1, 0), bs},
		{"", "", turnTokens(1, 1), bs},
		{"", "", turnTokens(1, 1), bs}, // again
		{"", "", turnTokens(2, 3), bs},
		{"", "", turnTokens(1, 4), bs},
		{"", "", turnTokens(1, 4)[:bs-1], bs}, // less than a block
		{"adapter", "", turnTokens(1, 5), bs},
		{"", "salt", turnTokens(1, 5), bs},
		{"", "", turnTokens(1, 5), 2 * bs},
		{"", "", turnTokens(1, 6), bs},
		{"", "", turnTokens(1, 2), bs}, // shorter than what is remembered
	} {
		want := Keys("", c.lora, c.salt, c.tokens, c.bs)
		if got := m.Keys(c.lora, c.salt, c.tokens, c.bs); !slices.Equal(got, want) {
			t.Errorf("lora %q salt %q, %d tokens in blocks of %d: the memo's keys differ from Keys'", c.lora, c.salt, len(c.tokens), c.bs)
		}
	}
}

// A turn that extends the earlier one hashes only what it appends; the same prompt again hashes
// nothing.
func TestKeyMemoHashesOnlyWhatATurnAppends(t *testing.T) {
	var m KeyMemo
	first := m.Keys("", "", turnTokens(1, 2), bs)
	again := m.Keys("", "", turnTokens(1, 2), bs)
	if &again[0] != &first[0] {
		t.Error("the same prompt again was hashed again")
	}
	// Marking the last remembered key shows whether the next turn's keys are chained from it or
	// hashed afresh: only the first keeps the mark and carries it into the appended blocks.
	first[len(first)-1] ^= 1
	next := turnTokens(1, 3)
	got := m.Keys("", "", next, bs)
	want := Keys("", "", "", next, bs)
	if got[len(first)-1] != first[len(first)-1] {
		t.Error("the extended turn's earlier blocks were hashed again")
	}
	if got[len(got)-1] == want[len(want)-1] {
		t.Error("the appended blocks were not chained from the remembered keys")
	}
	if !slices.Equal(got[:len(first)-1], want[:len(first)-1]) {
		t.Error("the earlier keys changed")
	}
	if len(m.entries) != 1 {
		t.Errorf("the memo holds %d entries for one conversation, want its latest turn only", len(m.entries))
	}
}

// No prompt stream can make the memo hold more than its bounds.
func TestKeyMemoStaysWithinItsBounds(t *testing.T) {
	var m KeyMemo
	for c := range 4 * memoEntries {
		m.Keys("", "", turnTokens(c, 1), bs)
	}
	if len(m.entries) > memoEntries {
		t.Errorf("%d entries, bound %d", len(m.entries), memoEntries)
	}
	big := make([]uint32, memoBytes/4/4/2) // an eighth of the bytes each
	for c := range 32 {
		for i := range big {
			big[i] = uint32(c)<<24 + uint32(i)
		}
		m.Keys("", "", slices.Clone(big), bs)
	}
	if m.bytes > memoBytes {
		t.Errorf("%d bytes held, bound %d", m.bytes, memoBytes)
	}
	sum := 0
	for _, e := range m.entries {
		sum += entryBytes(e)
	}
	if sum != m.bytes {
		t.Errorf("the memo counts %d bytes and holds %d", m.bytes, sum)
	}
	m.Keys("", "", make([]uint32, memoBytes/4), bs)
	if m.bytes > memoBytes {
		t.Errorf("one prompt took %d bytes, bound %d", m.bytes, memoBytes)
	}
}

// Turns of many conversations at once get their own keys (go test -race).
func TestKeyMemoServesConcurrentConversations(t *testing.T) {
	var m KeyMemo
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for turn := range 6 {
				tokens := turnTokens(c, turn)
				if got := m.Keys("", "", tokens, bs); !slices.Equal(got, Keys("", "", "", tokens, bs)) {
					t.Errorf("conversation %d turn %d: keys differ from Keys'", c, turn)
					return
				}
			}
		})
	}
	wg.Wait()
}
