package reqkey

import "math"

// HistoryKeyBothWays writes the history key of the chat body raw in one pass, into a builder the
// size of its bound, and in two, counting it first; and returns both keys, the bytes the writer
// writes (text or not), and the bound. ok is false when raw does not parse or is not a chat.
func HistoryKeyBothWays(raw []byte) (onePass, twoPass string, written, bound int, ok bool) {
	var b body
	if parseBody(raw, &b) != nil || b.messages == nil {
		return "", "", 0, 0, false
	}
	onePass, _ = writeHistoryKey(b.tools, b.messages, math.MaxInt)
	twoPass, _ = writeHistoryKey(b.tools, b.messages, -1)
	h := historyWriter{v: valid(b.messages.data), inOrder: b.messages.inOrder}
	h.c.v = h.v
	h.write(b.tools, b.messages)
	return onePass, twoPass, h.w.n, b.messages.size + b.tools.bound().size, true
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
