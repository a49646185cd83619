package protocol

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"strings"
	"testing"
)

// arrayOf is a tools array of at least size bytes, different for each id.
func arrayOf(id, size int) []byte {
	a := fmt.Appendf(nil, `[{"type":"function","function":{"name":"t%d","description":"`, id)
	a = append(a, strings.Repeat("d", max(0, size-len(a)-4))...)
	return append(a, `"}}]`...)
}

// The memo remembers an array the second time it is offered, and only one of the sizes it keeps;
// it never holds more than its slots, and a full memo gives up an entry not matched since the
// clock last passed rather than one matched.
func TestToolsMemoRemembersWhatComesBackWithinItsBounds(t *testing.T) {
	m := &toolsMemo{seed: maphash.MakeSeed()}
	offer := func(raw []byte) { m.offer(chatToolsKind, raw, []byte("key"), true, toolsAdded{n: 1}) }
	// held looks without matching, which would mark the entry for the clock.
	held := func(raw []byte) bool {
		if p := m.entries.Load(); p != nil {
			for _, e := range *p {
				if e.kind == chatToolsKind && bytes.Equal(e.raw, raw) {
					return true
				}
			}
		}
		return false
	}

	big := arrayOf(0, 4<<10)
	offer(big)
	if held(big) {
		t.Fatal("an array offered once is remembered")
	}
	offer(big)
	if m.find(chatToolsKind, big) == nil || m.find(messagesToolsKind, big) != nil {
		t.Fatal("an array offered twice is not remembered, or not only for its API")
	}
	for _, raw := range [][]byte{arrayOf(1, toolsMemoMinBytes-1), arrayOf(2, toolsMemoMaxBytes)} {
		offer(raw)
		offer(raw)
		if held(raw) {
			t.Fatalf("an array of %d bytes is remembered", len(raw))
		}
	}

	for id := 10; id < 10+2*toolsMemoSlots; id++ {
		m.find(chatToolsKind, big) // matched every time: the clock keeps it
		raw := arrayOf(id, 2<<10)
		offer(raw)
		offer(raw)
		if !held(raw) {
			t.Fatalf("array %d, offered twice, is not remembered", id)
		}
		if n := len(*m.entries.Load()); n > toolsMemoSlots {
			t.Fatalf("%d entries, over %d slots", n, toolsMemoSlots)
		}
	}
	if !held(big) {
		t.Fatal("the array matched before every replacement was given up")
	}
	if held(arrayOf(10, 2<<10)) {
		t.Fatal("the oldest array, never matched again, is still remembered")
	}
	copied := arrayOf(99, 2<<10)
	offer(copied)
	offer(copied)
	copied[len(copied)-5] = 'x'
	if held(copied) || !held(arrayOf(99, 2<<10)) {
		t.Fatal("the memo holds the offered bytes, not a copy")
	}
}

// A remembered array's part of the key is copied from the memo, not written again: a marked copy
// of its entry shows in the key.
func TestParseCopiesTheKeyPartOfARememberedArray(t *testing.T) {
	old := rememberedTools
	rememberedTools = &toolsMemo{seed: maphash.MakeSeed()}
	defer func() { rememberedTools = old }()
	tools := arrayOf(0, 4<<10)
	body := []byte(`{"model":"m","tools":` + string(tools) + `,"messages":[{"role":"user","content":"hi"}]}`)
	var first string
	for range 2 {
		r, err := ParseChat(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		first = r.Text
	}
	e := rememberedTools.find(chatToolsKind, tools)
	if e == nil {
		t.Fatal("a tools array parsed twice is not remembered")
	}
	marked := &toolsEntry{kind: e.kind, raw: e.raw, key: append([]byte("MARK"), e.key...), text: e.text, added: e.added}
	marked.added.hist.size += len("MARK")
	rememberedTools.entries.Store(&[]*toolsEntry{marked})
	r, err := ParseChat(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.Text != "MARK"+first {
		t.Fatalf("key %.60q, want the marked entry's part before %.60q", r.Text, first)
	}
}
