package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// ConversationsConfig shapes a replay of recorded conversations.
type ConversationsConfig struct {
	OutputTokens int // max_tokens of every request
	Think        time.Duration
	Limit        int // at most this many conversations (0: all)
}

// Conversations reads the input format of vLLM's multi-turn benchmark, a JSON list of
// {"id", "messages": [{"role", "content"}, ...]}, and replays its user turns: every user message
// ends a turn (with any system or other non-assistant messages before it), and the recorded
// assistant answers are dropped, because the server's own answers take their place.
func Conversations(r io.Reader, c ConversationsConfig) (Workload, error) {
	var convs []struct {
		ID       json.RawMessage `json:"id"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r).Decode(&convs); err != nil {
		return Workload{}, fmt.Errorf("conversations: %w", err)
	}
	if c.OutputTokens < 1 {
		return Workload{}, fmt.Errorf("--output-tokens must be at least 1")
	}
	w := Workload{Name: "conversations"}
	for i, conv := range convs {
		if c.Limit > 0 && len(w.Sessions) == c.Limit {
			break
		}
		id := strings.Trim(string(conv.ID), `"`)
		if id == "" {
			id = fmt.Sprintf("conv-%d", i)
		}
		s := Session{ID: id}
		var pending []Message
		for k, m := range conv.Messages {
			text, err := contentString(m.Content)
			if err != nil {
				return Workload{}, fmt.Errorf("conversations: %s, message %d: %w", id, k, err)
			}
			switch m.Role {
			case "assistant":
				continue
			case "user":
				pending = append(pending, Message{Role: "user", Content: text})
				t := Turn{Append: pending, MaxTokens: c.OutputTokens}
				if len(s.Turns) > 0 {
					t.Think = c.Think
				}
				s.Turns = append(s.Turns, t)
				pending = nil
			default:
				pending = append(pending, Message{Role: m.Role, Content: text})
			}
		}
		if len(s.Turns) > 0 {
			w.Sessions = append(w.Sessions, s)
		}
	}
	if len(w.Sessions) == 0 {
		return Workload{}, fmt.Errorf("conversations: no conversation with a user message")
	}
	return w, nil
}

// contentString reduces a message content (a string, or an array of text parts) to text.
func contentString(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
