package reqkey

import "math"

// KeyPasses is the history key of a chat body written both ways, and what the writer took.
type KeyPasses struct {
	OnePass, TwoPass string // the key written in one pass, into a buffer of its bound, and in two
	Written, Bound   int    // the bytes the writer writes (text or not), and their bound
	MembersOutgrown  bool   // a canonical value has more members than recs was sized for
}

// HistoryKeyBothWays writes the history key of the chat body raw in one pass and in two. ok is
// false when raw does not parse or is not a chat.
func HistoryKeyBothWays(raw []byte) (k KeyPasses, ok bool) {
	var b body
	if parseBody(raw, &b) != nil || b.messages == nil {
		return k, false
	}
	k.OnePass, _ = writeHistoryKey(b.tools, b.messages, math.MaxInt)
	k.TwoPass, _ = writeHistoryKey(b.tools, b.messages, -1)
	h := newHistoryWriter(b.tools, b.messages)
	members := cap(h.c.recs)
	h.write(b.tools, b.messages)
	k.Written, k.Bound = h.w.n, b.messages.size+b.tools.bound().size
	k.MembersOutgrown = cap(h.c.recs) != members
	return k, true
}

// WritesHistoryKeyInOnePass reports whether Parse writes the history key of the chat body raw in
// one pass, and returns the key.
func WritesHistoryKeyInOnePass(raw []byte) (key string, onePass bool) {
	var b body
	if parseBody(raw, &b) != nil {
		return "", false
	}
	return writeHistoryKey(b.tools, b.messages, historyKeyLimit(raw))
}
