package protocol_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// toolArrays returns tools arrays of at least 1.5 KiB each: tools, an agent's schemas as the API
// sends them; three arrays of the tools of random bodies from doc that the parser accepts; and two
// of the tools of any of them, of every shape the generator makes, most of them refused.
func toolArrays(r *rand.Rand, doc func() []byte, accepts func([]byte) bool, tools []byte) [][]byte {
	var valid, any []json.RawMessage
	for len(valid) < 100 {
		body := doc()
		var top map[string]json.RawMessage
		var arr []json.RawMessage
		if json.Unmarshal(body, &top) == nil && json.Unmarshal(top["tools"], &arr) == nil {
			any = append(any, arr...)
			if accepts(body) {
				valid = append(valid, arr...)
			}
		}
	}
	arrays := [][]byte{tools}
	for i := range 5 {
		elems := valid
		if i >= 3 {
			elems = any
		}
		a := []byte{'['}
		for len(a) < 1536 {
			if len(a) > 1 {
				a = append(a, ',')
			}
			a = append(a, elems[r.IntN(len(elems))]...)
		}
		arrays = append(arrays, append(a, ']'))
	}
	return arrays
}

// withField puts the member name: value into the body doc, first or last: where a later member
// of the same name replaces it, or it replaces an earlier one.
func withField(r *rand.Rand, doc []byte, name string, value []byte) []byte {
	member := append([]byte(`"`+name+`":`), value...)
	switch {
	case bytes.Equal(doc, []byte("{}")):
		return append(append([]byte{'{'}, member...), '}')
	case r.IntN(2) == 0:
		return append(append(append([]byte{'{'}, member...), ','), doc[1:]...)
	}
	return append(append(append(doc[:len(doc)-1:len(doc)-1], ','), member...), '}')
}

// toolsOf returns the tools array of the chat body.
func toolsOf(t *testing.T, chat []byte) []byte {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(chat, &top); err != nil || top["tools"] == nil {
		t.Fatalf("no tools in %.100s", chat)
	}
	return top["tools"]
}

// A tools array the memo holds is read as it was the first time: on random bodies that carry one
// of a few large tools arrays (an agent's schemas, and arrays of random tools, valid or not), each
// parser agrees with its encoding/json reference, and writes the same key in one pass and in two,
// whether the array was remembered or not.
func TestRememberedToolsAreReadAsTheFirstTime(t *testing.T) {
	defer protocol.FreshToolsMemo()()
	chat := toolsChatBody()
	responses, messages := chatAs(chat)
	check := func(t *testing.T, r *rand.Rand, doc func() []byte, tools []byte, parse func(body []byte) error) {
		arrays := toolArrays(r, doc, func(body []byte) bool { return parse(body) == nil }, tools)
		n, remembered, parsed := scaled(10000), 0, 0
		for range n {
			tools := arrays[r.IntN(len(arrays))]
			if protocol.ToolsRemembered(tools) {
				remembered++
			}
			if parse(withField(r, doc(), "tools", tools)) == nil {
				parsed++
			}
		}
		if remembered < n/3 || parsed < n/20 {
			t.Fatalf("%d of %d bodies parsed, %d carried a remembered array: the memo went unused", parsed, n, remembered)
		}
		t.Logf("%d of %d bodies parsed, %d carried a remembered array", parsed, n, remembered)
	}
	t.Run("chat", func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 0))
		check(t, r, func() []byte { return randomDoc(r) }, toolsOf(t, chat), func(body []byte) error {
			got, err := protocol.ParseChat(nil, body)
			want, refErr := refParse(nil, body)
			if m := referenceMismatch(got, err, want, refErr, sameErrorText); m != "" {
				t.Fatalf("body %.300s: %s", body, m)
			}
			if k, ok := protocol.HistoryKeyBothWays(body); ok && (k.OnePass != k.TwoPass || k.Written > k.Bound) {
				t.Fatalf("body %.300s: key %d bytes in one pass, %d in two, %d written within a bound of %d",
					body, len(k.OnePass), len(k.TwoPass), k.Written, k.Bound)
			}
			return err
		})
	})
	for i, p := range agentProtocols {
		body := responses
		if p.name == "messages" {
			body = messages
		}
		t.Run(p.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(21, uint64(i+1)))
			check(t, r, func() []byte { return randomAgentDoc(r, p) }, toolsOf(t, body), func(body []byte) error {
				_, err := sameAsReference(t, p, nil, body)
				checkAgentBothWays(t, p, body)
				return err
			})
		})
	}
}

// messageElements returns the elements of the messages arrays of random bodies from doc that the
// parser accepts, and of any of them, of every shape the generator makes.
func messageElements(doc func() []byte, accepts func([]byte) bool) (valid, any []json.RawMessage) {
	for len(valid) < 100 {
		body := doc()
		var top map[string]json.RawMessage
		var arr []json.RawMessage
		if json.Unmarshal(body, &top) == nil && json.Unmarshal(top["messages"], &arr) == nil {
			any = append(any, arr...)
			if accepts(body) {
				valid = append(valid, arr...)
			}
		}
	}
	return valid, any
}

// The turns of a conversation are read as if each were the first: on conversations of random
// messages that grow turn by turn (each turn appending some and now and then changing the last,
// as a client that moves its cache marker does) in random bodies, each parser agrees with its
// encoding/json reference and writes the same key in one pass and in two, whether the memo held
// the beginning of the conversation or not.
func TestConversationTurnsAreReadAsTheFirstTime(t *testing.T) {
	defer protocol.FreshConversationMemo()()
	long := `{"role":"user","content":"` + strings.Repeat(`read the file\n\t\"main.go\" `, 80) + `"}`
	check := func(t *testing.T, r *rand.Rand, doc func() []byte, parse func(body []byte) error) {
		valid, any := messageElements(doc, func(body []byte) bool { return parse(body) == nil })
		draw := func() []byte {
			if r.IntN(10) == 0 {
				return any[r.IntN(len(any))]
			}
			return valid[r.IntN(len(valid))]
		}
		turns, remembered, parsed := 0, 0, 0
		for range scaled(2000) {
			msgs := [][]byte{[]byte(long), draw()}
			for range 2 + r.IntN(8) {
				if r.IntN(2) == 0 {
					msgs[len(msgs)-1] = draw() // the last message changes
				}
				for range 1 + r.IntN(3) {
					msgs = append(msgs, draw())
				}
				arr := append(append([]byte{'['}, bytes.Join(msgs, []byte{','})...), ']')
				if protocol.ConversationRemembered(arr) {
					remembered++
				}
				turns++
				if parse(withField(r, doc(), "messages", arr)) == nil {
					parsed++
				}
			}
		}
		if remembered < turns/3 || parsed < turns/20 {
			t.Fatalf("%d of %d turns parsed, %d began with a remembered conversation: the memo went unused", parsed, turns, remembered)
		}
		t.Logf("%d of %d turns parsed, %d began with a remembered conversation", parsed, turns, remembered)
	}
	t.Run("chat", func(t *testing.T) {
		r := rand.New(rand.NewPCG(22, 0))
		check(t, r, func() []byte { return randomDoc(r) }, func(body []byte) error {
			got, err := protocol.ParseChat(nil, body)
			want, refErr := refParse(nil, body)
			if m := referenceMismatch(got, err, want, refErr, sameErrorText); m != "" {
				t.Fatalf("body %.300s: %s", body, m)
			}
			if k, ok := protocol.HistoryKeyBothWays(body); ok && (k.OnePass != k.TwoPass || k.Written > k.Bound) {
				t.Fatalf("body %.300s: key %d bytes in one pass, %d in two, %d written within a bound of %d",
					body, len(k.OnePass), len(k.TwoPass), k.Written, k.Bound)
			}
			return err
		})
	})
	t.Run("messages", func(t *testing.T) {
		r := rand.New(rand.NewPCG(22, 1))
		check(t, r, func() []byte { return randomAgentDoc(r, &messagesProtocol) }, func(body []byte) error {
			_, err := sameAsReference(t, &messagesProtocol, nil, body)
			checkAgentBothWays(t, &messagesProtocol, body)
			return err
		})
	})
}
