package protocol

import "strings"

// history.go is what the history keys of all protocols share: the framing, the writer and its
// buffer's bound. Each protocol's file says what its key holds (chat.go, responses.go,
// messages.go).
//
// A history key serializes a conversation so that a conversation's key is a byte prefix of the
// key of any continuation of it (the same tools, messages appended). Every free-text field is
// written as its bytes followed by the byte 0xFF (fieldEnd), behind a one-letter tag, and every
// message ends with ".". No text holds 0xFF (see fieldEnd), so the end of a field is never taken
// for text: moving text from one field or message to another always changes the key. A
// conversation with no text at all (only images, say) has an empty key: there is nothing a worker
// could have cached that we could match.
//
// A field's text comes right after its tag, with nothing before it that depends on the rest of
// it, so two conversations whose messages agree up to some byte of a text have keys that agree up
// to that byte too: a shared document at the start of a user message, a long preamble or a set of
// few-shot examples is a shared prefix of the keys, as it is of the prompts a worker caches. (A
// length before each text, as in "<len>:<bytes>", would part the keys at its digits.)
//
// The framing is kept small on purpose: the router's match ratio is matched bytes over key bytes,
// and bulky shared framing ("role: user, name: ...") would make unrelated short chats look alike.
// The common roles are one letter; other fields appear only when present.

// TurnEnds calls f with every length at which a shorter history key of the same conversation
// may end, before the key's own: the end of each message whose last field closes it ("\xff."),
// in order. An earlier turn of a conversation (the same tools, fewer messages) has one of these
// keys. A completion's key, its prompt, has none.
func TurnEnds(key string, f func(n int)) {
	for at := 0; ; {
		i := strings.Index(key[at:], "\xff.")
		if i < 0 {
			return
		}
		at += i + 2
		if at < len(key) {
			f(at)
		}
	}
}

// newHistoryWriter returns a writer of a history key read from the body v, whose canonical values
// have at most members object members. It counts the key until given a buffer.
func newHistoryWriter(v valid, members int) historyWriter {
	h := historyWriter{v: v}
	h.c.v = v
	if members > 0 {
		h.c.recs = make([]member, 0, members)
	}
	return h
}

// writeKey writes a key whose size and named tools are at most bound's, by calling write once
// or twice: in one pass into a buffer of the bound's size when that is within limit; otherwise a
// first pass counts the key's bytes and the second writes it into a buffer of exactly that size.
// write writes the whole key into h.w, or counts it when h.w has no buffer. A key without text is
// empty.
func (h *historyWriter) writeKey(bound keyBound, room keyRoom, write func()) (key string, onePass bool) {
	size := bound.size
	if onePass = size <= room.limit; onePass {
		h.named = bound.named
	} else {
		write()
		if !h.w.text {
			return "", false
		}
		size = h.w.n
	}
	h.w = room.writer(size)
	write()
	if !h.w.text {
		return "", onePass
	}
	return h.w.string(), onePass
}

// historyWriter writes the history key of one chat, Responses or Messages body, or counts its
// bytes.
type historyWriter struct {
	v valid
	w keyWriter
	c canonicalizer
	// named is the most tools with a name: the writing pass sorts them. The counting pass counts
	// them exactly.
	named int
	// inOrder says that the messages array is given once and its messages are in order (see
	// keyBound). Each message's content is then written as it is read, rather than found first
	// and read again.
	inOrder bool
	// Scratch space, sized once: cursors over the messages or tools arrays, the positions of the
	// elements of the message being read, and cursors over its tool_calls arrays.
	outer, elems, inner []int
	// The tool_calls arrays of the message being read: the first given since the field was last
	// cleared is in its element callsElem (an index in elems), at callsPos; callsN were given.
	callsElem, callsPos, callsN int
	keyBuf                      [nameLen]byte
}

// role writes the role of a message: one letter for the common roles.
func (h *historyWriter) role(role jstr) {
	switch string(role.name(h.keyBuf[:])) {
	case "system":
		h.w.byte('s')
	case "developer":
		h.w.byte('d')
	case "user":
		h.w.byte('u')
	case "assistant":
		h.w.byte('a')
	case "tool":
		h.w.byte('t')
	default:
		h.w.byte('r')
		h.w.field(role)
	}
}

func textPart(w *keyWriter, j jstr) { tagged(w, 'c', j) }

// tagged writes the text j as a field behind tag, when it is not empty.
func tagged(w *keyWriter, tag byte, j jstr) {
	if !j.empty() {
		w.text = true
		w.byte(tag)
		w.field(j)
	}
}

// object calls member with the key and the value's position of each member of the object at i,
// and returns the position after the object. member returns the position after the value. null
// leaves what the object would be decoded into as it is: it has no members.
func (h *historyWriter) object(i int, member func(key []byte, val int) int) int {
	if h.v[i] == 'n' {
		return i + len("null")
	}
	pos, more := h.v.first(i)
	for more {
		key, val := h.v.member(pos)
		pos, more = h.v.next(member(key.name(h.keyBuf[:]), val))
	}
	return pos
}

// stringField reads the string-typed field at val into *dst and returns the position after it:
// null leaves the field as it is.
func (h *historyWriter) stringField(dst *jstr, val int) int {
	if h.v[val] != '"' {
		return val + len("null")
	}
	var end int
	*dst, end = h.v.str(val)
	return end
}

// jstr is the string at pos, or the empty string when pos is 0 or holds another value.
func (h *historyWriter) jstr(pos int) jstr {
	if pos == 0 || h.v[pos] != '"' {
		return jstr{plain: true}
	}
	j, _ := h.v.str(pos)
	return j
}

// fieldString writes the string at pos (0: the empty string) as a field.
func (h *historyWriter) fieldString(pos int) {
	h.w.field(h.jstr(pos))
}

// fieldArguments writes a tool call's arguments as a field: the string as sent (OpenAI sends a
// JSON string), or the canonical JSON of an object some clients send instead.
func (h *historyWriter) fieldArguments(pos int) {
	if pos != 0 && h.v[pos] == '"' {
		h.fieldString(pos)
		return
	}
	h.fieldCanonical(pos)
}

// fieldCanonical writes the canonical JSON of the value at pos (nothing for 0 or null) as a
// field.
func (h *historyWriter) fieldCanonical(pos int) {
	if pos != 0 {
		h.c.write(&h.w, pos)
	}
	h.w.byte(fieldEnd)
}

// keyBound is what checking the elements of a messages or tools array learns of the history key
// they make, so that it can be written in one pass into a buffer of the right size (see
// historyKey) rather than counted first. Each element's bound covers what the key can take of it
// whichever element of the array field it is folded into (see valid.fold): the framing of one
// whole element, and the tag and end of each text field it holds, as many times as it is given.
type keyBound struct {
	size    int // the most bytes the key of the elements may take
	named   int // the most tools with a name among them
	members int // the most object members of a value the key writes in canonical form
	// inOrder says that each message has each of its fields once, in the order they are
	// written: role, name and tool_call_id before content, and content before tool_calls. Its
	// content can then be written as it is read.
	inOrder bool
}
