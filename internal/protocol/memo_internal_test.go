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
	offer := func(raw []byte) { m.offer(chatToolsKind, raw, []byte("key"), true, scanAdded{n: 1}) }
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

// convArray is a conversation array whose first element takes head bytes, then one element for
// each of turns.
func convArray(id, head int, turns ...string) []byte {
	a := fmt.Appendf(nil, `[{"role":"user","content":"%d %s"}`, id, strings.Repeat("x", head))
	for _, t := range turns {
		a = fmt.Appendf(a, `,{"role":"user","content":%q}`, t)
	}
	return append(a, ']')
}

// The conversation memo remembers a beginning the second time it is offered, or at once when it
// extends an entry, which it then replaces; it holds no more bytes than its limit and no more
// entries that begin alike than a bucket's.
func TestConversationMemoRemembersWhatComesBackWithinItsBounds(t *testing.T) {
	m := newConvMemo(1 << 20)
	// offer offers an array's elements, as the writer does: without its closing bracket.
	offer := func(array []byte, old *convEntry) {
		raw := array[:len(array)-1]
		m.offer(chatMessagesKind, raw, raw[:len(raw)/2], true, scanAdded{n: 2}, old)
	}
	first := convArray(1, 2<<10, "a")
	offer(first, nil)
	if m.find(chatMessagesKind, first) != nil {
		t.Fatal("a beginning offered once is remembered")
	}
	offer(first, nil)
	e := m.find(chatMessagesKind, first)
	if e == nil || m.find(messagesMessagesKind, first) != nil {
		t.Fatal("a beginning offered twice is not remembered, or not only for its API")
	}
	longer := convArray(1, 2<<10, "a", "b")
	if got := m.find(chatMessagesKind, longer); got != e {
		t.Fatal("an array that begins with a remembered one does not find it")
	}
	offer(longer, e)
	if got := m.find(chatMessagesKind, longer); got == e || got == nil || !e.gone {
		t.Fatal("a turn that extends an entry does not replace it")
	}
	if n := len(m.buckets); n != 1 {
		t.Fatalf("%d buckets, want 1", n)
	}

	for id := 10; id < 10+convBucket+2; id++ { // all alike in their first convHeadBytes
		raw := convArray(1, 2<<10, fmt.Sprint(id))
		offer(raw, nil)
		offer(raw, nil)
	}
	for _, b := range m.buckets {
		if len(b) > convBucket {
			t.Fatalf("%d entries begin alike, over %d", len(b), convBucket)
		}
	}
	for id := 100; id < 200; id++ {
		raw := convArray(id, 64<<10, "a")
		offer(raw, nil)
		offer(raw, nil)
		if m.bytes > m.limit {
			t.Fatalf("%d bytes held, over the limit of %d", m.bytes, m.limit)
		}
	}
	if m.find(chatMessagesKind, convArray(199, 64<<10, "a")) == nil {
		t.Fatal("the newest entry was given up")
	}
	if m.find(chatMessagesKind, convArray(100, 64<<10, "a")) != nil {
		t.Fatal("the oldest entry was kept past the limit")
	}
}

// A remembered beginning's part of the key is copied from the memo, not written again: a marked
// copy of its entry shows in the key.
func TestParseCopiesTheKeyPartOfARememberedConversation(t *testing.T) {
	old := rememberedConversations
	rememberedConversations = newConvMemo(convMemoBytes)
	defer func() { rememberedConversations = old }()
	body := func(turns ...string) []byte {
		return []byte(`{"model":"m","messages":` + string(convArray(1, 2<<10, turns...)) + `}`)
	}
	var want string
	for _, b := range [][]byte{body("a", "b"), body("a", "b"), body("a", "b", "c")} {
		r, err := ParseChat(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		want = r.Text
	}
	e := rememberedConversations.find(chatMessagesKind, convArray(1, 2<<10, "a", "b", "c", "d"))
	if e == nil || e.added.n != 3 {
		t.Fatalf("entry %+v, want the first three messages of the conversation remembered", e)
	}
	marked := *e
	marked.key = append([]byte("MARK"), e.key...)
	marked.added.hist.size += len("MARK")
	rememberedConversations.buckets[e.head] = []*convEntry{&marked}
	r, err := ParseChat(nil, body("a", "b", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Text != "MARK"+want {
		t.Fatalf("key %.60q, want the marked entry's part before %.60q", r.Text, want)
	}
}
