package prompt

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTokenize(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"Hello world", []string{"Hell", "o", " wor", "ld"}},
		{"a b", []string{"a", " b"}},
		{"<|user|>\nHi", []string{"<|us", "er|>", "\n", "Hi"}},
		{"x\n\ny", []string{"x", "\n", "\n", "y"}},
		{"héllo", []string{"hél", "lo"}},     // é is two bytes
		{"日本語", []string{"日", "本", "語"}},     // three bytes each
		{"\xffab", []string{"\xffab"}},       // invalid byte counts as one
		{"a\xe6\x97", []string{"a\xe6\x97"}}, // truncated sequence: single bytes
		{"👋👋", []string{"👋", "👋"}},           // four bytes each
		{"     ", []string{" ", " ", " ", " ", " "}},
	}
	for _, tt := range tests {
		got := Tokenize(tt.in)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Tokenize(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if n := CountTokens(tt.in); n != len(tt.want) {
			t.Errorf("CountTokens(%q) = %d, want %d", tt.in, n, len(tt.want))
		}
	}
}

func TestTokenize_NeverSplitsValidUTF8(t *testing.T) {
	text := "Prefix caching — 前缀缓存 — кэш префиксов 👋 done"
	for _, tok := range Tokenize(text) {
		if !utf8.ValidString(tok) {
			t.Fatalf("token %q splits a UTF-8 sequence", tok)
		}
		if len(tok) > maxTokenBytes && utf8.RuneCountInString(tok) > 1 {
			t.Fatalf("token %q longer than %d bytes", tok, maxTokenBytes)
		}
	}
}

func TestTokenize_EnglishRatio(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog while the router keeps its cache warm. ", 20)
	ratio := float64(len(text)) / float64(CountTokens(text))
	if ratio < 3 || ratio > 4 {
		t.Fatalf("%.2f bytes per token on English text, want between 3 and 4", ratio)
	}
}

func TestSequence_AppendTextMatchesWholeText(t *testing.T) {
	var s Sequence
	s.AppendText("<|user|>\nhello there\n")
	s.AppendText("<|assistant|>\n")
	s.AppendText(" more words")
	want := Tokenize(string(s.Text))
	if s.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(want))
	}
}

func conversation() []Message {
	return []Message{
		{Role: "system", Content: "You are terse."},
		{Role: "user", Content: "Find the bug in main.go"},
	}
}

func TestRenderChat_Format(t *testing.T) {
	var s Sequence
	msgs := append(conversation(), Message{Role: "assistant", ToolCalls: []ToolCall{{Name: "read", Arguments: `{"path":"main.go"}`}}},
		Message{Role: "tool", Content: "package main"})
	RenderChat(&s, []byte(`[{"type":"function"}]`), msgs, true)
	want := "<|tools|>\n[{\"type\":\"function\"}]<|end|>\n" +
		"<|system|>\nYou are terse.<|end|>\n" +
		"<|user|>\nFind the bug in main.go<|end|>\n" +
		"<|assistant|>\n<|tool_call|>read {\"path\":\"main.go\"}<|end|>\n" +
		"<|tool|>\npackage main<|end|>\n" +
		"<|assistant|>\n"
	if string(s.Text) != want {
		t.Fatalf("rendered\n%q\nwant\n%q", s.Text, want)
	}
	if s.Len() != CountTokens(want) {
		t.Fatalf("Len = %d, CountTokens = %d", s.Len(), CountTokens(want))
	}
}

// TestRenderChat_ReplyIsPrefixOfNextTurn checks the template property the
// prefix cache depends on: the prompt of turn 1 followed by the generated
// reply tokens and AssistantEnd is, token for token, the start of the
// rendered turn 2.
func TestRenderChat_ReplyIsPrefixOfNextTurn(t *testing.T) {
	checkReplyStartsNextTurn(t, nil, []string{"the", " bug", " is", " on", " a", " row"},
		Message{Role: "assistant", Content: "the bug is on a row"}, Message{Role: "user", Content: "Fix it"})
}

// checkReplyStartsNextTurn checks the property the prefix cache depends on: turn 1, conversation()
// rendered with tools and followed by the generated reply tokens and AssistantEnd, is token for
// token the start of turn 2, conversation() followed by next rendered with the same tools.
func checkReplyStartsNextTurn(t *testing.T, tools []byte, generated []string, next ...Message) {
	t.Helper()
	var turn1 Sequence
	RenderChat(&turn1, tools, conversation(), true)
	for _, tok := range generated {
		turn1.AppendToken(tok)
	}
	turn1.AppendText(AssistantEnd)

	var turn2 Sequence
	RenderChat(&turn2, tools, append(conversation(), next...), true)
	if !strings.HasPrefix(string(turn2.Text), string(turn1.Text)) {
		t.Fatalf("turn 2 text does not start with turn 1 + reply:\n%q\n%q", turn2.Text, turn1.Text)
	}
	if !reflect.DeepEqual(turn2.Ends[:turn1.Len()], turn1.Ends) {
		t.Fatal("turn 2 tokens differ from turn 1 + reply within the shared prefix")
	}
}

func TestRenderIDs(t *testing.T) {
	var s Sequence
	RenderIDs(&s, []int64{1, 22, 33333})
	if s.Len() != 3 || string(s.Text) != " 1 22 33333" {
		t.Fatalf("got %d tokens %q", s.Len(), s.Text)
	}
}

// TestAppendToolCall_ReplyIsPrefixOfNextTurn checks the property a tool
// call generated as the tokens of its rendering relies on: turn 1's prompt
// followed by those tokens and AssistantEnd is, token for token, the start
// of turn 2, which sends the call back and its result.
func TestAppendToolCall_ReplyIsPrefixOfNextTurn(t *testing.T) {
	tools := []byte(`[{"type":"function","function":{"name":"read"}}]`)
	call := ToolCall{Name: "read", Arguments: `{"path":"main.go","n":1}`}
	checkReplyStartsNextTurn(t, tools, Tokenize(string(AppendToolCall(nil, call))),
		Message{Role: "assistant", ToolCalls: []ToolCall{call}}, Message{Role: "tool", Content: "package main"})
}

func TestTokenID_EqualTokensEqualIDsAndIDPromptsKeepTheirIDs(t *testing.T) {
	var s Sequence
	RenderIDs(&s, []int64{0, 7, 12345, 1<<31 - 1})
	got := s.AppendIDs(nil, 0, s.Len())
	if want := []uint32{0, 7, 12345, 1<<31 - 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ids of a token-id prompt = %v, want %v", got, want)
	}
	for _, tok := range []string{"Hell", "o", " wor", "<|us", "\n", " 012", " 2147483648", " -1", " "} {
		id := TokenID(tok)
		if id&hashedBit == 0 {
			t.Errorf("TokenID(%q) = %d, want a hashed id (top bit set)", tok, id)
		}
		if id != TokenID([]byte(tok)) {
			t.Errorf("TokenID(%q) differs between string and bytes", tok)
		}
	}
	var a, b Sequence
	a.AppendText("Hello world, hello world")
	b.AppendText("Hello world")
	if ia, ib := a.AppendIDs(nil, 0, 3), b.AppendIDs(nil, 0, 3); !reflect.DeepEqual(ia, ib) {
		t.Fatalf("the same text gave ids %v and %v", ia, ib)
	}
	if TokenID("Hell") == TokenID(" wor") {
		t.Fatal("two distinct tokens share an id")
	}
}
