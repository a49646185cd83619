package protocol_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// checkBothWays fails unless the history key or routing text of body is the same written in one
// pass and in two, and the one-pass writer never outgrows the buffer sized to its bound, nor the
// canonicalizer its records sized to the members the lexer counted.
func checkBothWays(t testing.TB, body []byte) {
	t.Helper()
	if one, two, outgrown, ok := protocol.RoutingTextBothWays(body); ok {
		if one != two {
			t.Fatalf("body %.300q: routing text rendered in one pass\n%.300q\nin two\n%.300q", body, one, two)
		}
		if outgrown {
			t.Fatalf("body %.300q: a prompt renders to more than its bound", body)
		}
	}
	k, ok := protocol.HistoryKeyBothWays(body)
	switch {
	case !ok:
	case k.OnePass != k.TwoPass:
		t.Fatalf("body %.300q: key written in one pass\n%.300q\nin two\n%.300q", body, k.OnePass, k.TwoPass)
	case k.Written > k.Bound:
		t.Fatalf("body %.300q: the key writer writes %d bytes, over the bound of %d", body, k.Written, k.Bound)
	case k.MembersOutgrown:
		t.Fatalf("body %.300q: a canonical value has more members than the lexer counted", body)
	}
}

// A chat whose key is mostly its text is written in one pass: the two-message body of the router's
// profile, agent conversations, and bodies of tiny parts.
func TestHistoryKeyOfTextChatsIsWrittenInOnePass(t *testing.T) {
	bodies := map[string][]byte{
		"two messages":         twoMessagesBody(4 << 10),
		"agent chat":           agentChatBody(64 << 10),
		"4-byte content parts": tinyPartsBody(64 << 10),
		"one-letter messages":  tinyMessagesBody(64 << 10),
		// Each tool is four bytes of key ("T" and three empty fields) for three of body.
		"empty tools": repeatedBody(64<<10, `{"messages":[{"content":"a"}],"tools":[`, `{}`, ",", `]}`),
		"messages out of order": []byte(`{"messages":[{"content":"You are terse.","role":"system"},` +
			`{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"ls"}}]},` +
			`{"content":"a b","tool_call_id":"1","role":"tool"}]}`),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			key, onePass := protocol.WritesHistoryKeyInOnePass(body)
			if !onePass {
				t.Errorf("the key was counted first")
			}
			r, err := protocol.ParseChat(nil, body)
			if err != nil {
				t.Fatal(err)
			}
			if key == "" || key != r.Text {
				t.Errorf("key %.40q, Parse's %.40q", key, r.Text)
			}
			checkBothWays(t, body)
		})
	}
}

// A chat whose key may outgrow twice its body is counted first, then written into a builder of its
// exact size: the builder of the bound would take more than the parse may.
func TestHistoryKeyThatMayOutgrowTwiceTheBodyIsCountedFirst(t *testing.T) {
	n := 1 << 12
	tests := []struct {
		name string
		body []byte
		want string // the key, when short enough to spell out
	}{
		// Each byte of invalid UTF-8 is U+FFFD in the key, three bytes.
		{"invalid UTF-8 content", []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("\xff", n) + `"}]}`),
			"uc" + strings.Repeat("\uFFFD", n) + "\xff."},
		// The canonical form of a number may be longer than the number: the bound allows the
		// longest, and 0.5 is written as it is.
		{"tool parameters of small floats", []byte(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"function":{"name":"f","parameters":[` +
			strings.Repeat("0.5,", n) + `0.5]}}]}`),
			spelled("Tf··[" + strings.Repeat("0.5,", n) + "0.5]·uchi·.")},
		{"tool parameters of large numbers", repeatedBody(n, `{"messages":[{"content":"a"}],"tools":[{"function":{"parameters":[`, `1e20`, ",", `]}}]}`), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, onePass := protocol.WritesHistoryKeyInOnePass(tt.body)
			if onePass {
				t.Errorf("the key was written in one pass")
			}
			if tt.want != "" && key != tt.want {
				t.Errorf("key %.60q, want %.60q", key, tt.want)
			}
			r, err := protocol.ParseChat(nil, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := refParse(nil, tt.body)
			if err != nil || key != r.Text || key != ref.Text {
				t.Errorf("key %.40q, Parse's %.40q, the reference's %.40q (%v)", key, r.Text, ref.Text, err)
			}
			checkBothWays(t, tt.body)
		})
	}
}

// The key is the same written in one pass or in two, and the bound covers every byte the writer
// writes, on bodies shaped like requests with the fields repeated, nested, null and out of order.
func TestHistoryKeyOnePassMatchesTwoPassesOnRandomBodies(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	n := orShort(100000)
	for range n {
		checkBothWays(t, randomDoc(r))
	}
}

// Routing text is rendered in one pass unless its bound is over twice the body: a prompt of
// numbers not written as they are, each of which may take hundreds of bytes.
func TestRoutingTextOfManyFloatsIsCountedFirst(t *testing.T) {
	tests := []struct {
		body    []byte
		onePass bool
	}{
		{[]byte(`{"prompt":"` + strings.Repeat("word ", 1000) + `"}`), true},
		{repeatedBody(4096, `{"prompt":[`, `151643`, ",", `]}`), true},
		{repeatedBody(4096, `{"prompt":[`, `0.5`, ",", `]}`), false},
	}
	for _, tt := range tests {
		one, two, outgrown, ok := protocol.RoutingTextBothWays(tt.body)
		if !ok || one != two || outgrown || one == "" {
			t.Fatalf("body %.60q: rendered %.40q in one pass, %.40q in two; bound outgrown %v", tt.body, one, two, outgrown)
		}
		if r, err := protocol.ParseChat(nil, tt.body); err != nil || r.Text != one {
			t.Fatalf("body %.60q: Parse gives %.40q, %v", tt.body, r.Text, err)
		}
		if got := protocol.RendersRoutingTextInOnePass(tt.body); got != tt.onePass {
			t.Errorf("body %.60q: rendered in one pass %v, want %v", tt.body, got, tt.onePass)
		}
	}
}
