package bench

import (
	"reflect"
	"strings"
	"testing"
)

func TestConversationsReplaysUserTurns(t *testing.T) {
	in := `[
	 {"id": "c1", "messages": [
	   {"role": "system", "content": "be brief"},
	   {"role": "user", "content": "hi"},
	   {"role": "assistant", "content": "recorded answer"},
	   {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "text", "text": "then?"}]},
	   {"role": "assistant", "content": "dropped"}]},
	 {"id": 7, "messages": [{"role": "assistant", "content": "no user turn"}]},
	 {"id": "c3", "messages": [{"role": "user", "content": "one"}]}
	]`
	w, err := Conversations(strings.NewReader(in), ConversationsConfig{OutputTokens: 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 2 || w.Sessions[0].ID != "c1" || w.Requests() != 3 {
		t.Fatalf("sessions %+v", w.Sessions)
	}
	turns := w.Sessions[0].Turns
	if !reflect.DeepEqual(turns[0].Append, []Message{{"system", "be brief"}, {"user", "hi"}}) ||
		!reflect.DeepEqual(turns[1].Append, []Message{{"user", "and then?"}}) || turns[1].MaxTokens != 9 {
		t.Fatalf("turns %+v", turns)
	}
	// Replayed, the second request carries the server's answer, not the recorded one.
	var conv conversation
	conv.next(&turns[0])
	conv.reply("server answer", nil)
	msgs, _ := conv.next(&turns[1])
	if msgs[2].Message != (Message{"assistant", "server answer"}) || len(msgs) != 4 {
		t.Fatalf("second request %+v", msgs)
	}
}
