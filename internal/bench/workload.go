package bench

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Message is one chat message as the bench sends it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Turn is one request of a session. Its messages are the conversation so far (every earlier
// turn's messages followed by the server's actual reply to it) plus Append, unless Fresh is set,
// in which case Append alone is the request's conversation.
type Turn struct {
	Append    []Message
	Fresh     bool // the turn does not extend the conversation (trace replays)
	MaxTokens int
	IgnoreEOS bool // ask for exactly MaxTokens output tokens (vLLM's ignore_eos)
	// Think is the pause between the end of the previous turn and this one (closed loop).
	Think time.Duration
	// At is the earliest send time, measured from the start of the run (paced workloads).
	At time.Duration
	// Tokens is the request's working set, its prompt and output tokens, when the workload
	// knows them (trace replays): the KV its session holds from this turn on. 0 when unknown.
	Tokens int
}

// Session is a sequence of turns sent in order: a turn starts when the previous response ends.
type Session struct {
	ID    string
	Tools json.RawMessage // the request's "tools" array, sent with every turn; nil for none
	Turns []Turn
}

// Workload is what the runner replays: every session, in start order.
type Workload struct {
	Name     string
	Sessions []Session
	// Paced workloads send each turn no earlier than its At; closed-loop workloads keep a
	// fixed number of sessions running at once.
	Paced bool
	// ReuseCeiling is the hit rate of one infinite prefix cache that saw every request in
	// workload order (sessions in start order, each session's turns in order): the share of
	// the requests' blocks that lead their prompt and were in an earlier request. nil when the
	// workload does not know its blocks.
	ReuseCeiling *float64
}

// Requests is the number of requests the workload sends when every turn succeeds.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Sessions {
		n += len(w.Sessions[i].Turns)
	}
	return n
}

// messagesJSONBytes is the size of msgs as a JSON array of {"role","content"} objects, counting
// each string as written when it needs no escaping (the text of the bench's generated and trace
// workloads); a string that does is counted short by its escapes.
func messagesJSONBytes(msgs []Message) int {
	n := 2 // [ ]
	for i, m := range msgs {
		if i > 0 {
			n++ // ,
		}
		n += len(`{"role":"","content":""}`) + len(m.Role) + len(m.Content)
	}
	return n
}

// promptBytes describes the size of every turn's messages as JSON. Only turns that stand alone
// (Fresh) are counted whole; the others carry the conversation before them as well, which the
// workload does not hold.
func (w *Workload) promptBytes() PromptBytes {
	var sizes []float64
	sum := 0.0
	for i := range w.Sessions {
		for j := range w.Sessions[i].Turns {
			b := float64(messagesJSONBytes(w.Sessions[i].Turns[j].Append))
			sizes = append(sizes, b)
			sum += b
		}
	}
	if len(sizes) == 0 {
		return PromptBytes{}
	}
	slices.Sort(sizes)
	return PromptBytes{Mean: sum / float64(len(sizes)), P50: percentileSorted(sizes, 50), Max: sizes[len(sizes)-1]}
}

// SelectRequests keeps the turns whose messages weigh, as JSON, at least minBytes and at most
// maxBytes (0: no bound), at most limit of them in workload order (0: all), and drops sessions
// left empty. Every turn must stand alone (Fresh: trace replays), since a turn that extends the
// previous one cannot be sent without it. The reuse ceiling, which was the whole workload's, is
// dropped when anything is.
func (w *Workload) SelectRequests(minBytes, maxBytes, limit int) error {
	if minBytes < 0 || maxBytes < 0 || limit < 0 || (maxBytes > 0 && maxBytes < minBytes) {
		return fmt.Errorf("prompt bytes %d to %d, limit %d: want bounds of at least 0, the upper one not below the lower", minBytes, maxBytes, limit)
	}
	kept, total := 0, 0
	var sessions []Session
	for _, s := range w.Sessions {
		var turns []Turn
		for _, t := range s.Turns {
			total++
			if !t.Fresh {
				return fmt.Errorf("workload %s: selecting requests by size needs requests that stand alone (cctrace, mooncake), not turns that extend a conversation", w.Name)
			}
			b := messagesJSONBytes(t.Append)
			if b < minBytes || (maxBytes > 0 && b > maxBytes) || (limit > 0 && kept >= limit) {
				continue
			}
			turns = append(turns, t)
			kept++
		}
		if len(turns) > 0 {
			s.Turns = turns
			sessions = append(sessions, s)
		}
	}
	if kept == 0 {
		return fmt.Errorf("workload %s: no request of %d to %d bytes", w.Name, minBytes, maxBytes)
	}
	if kept < total {
		w.ReuseCeiling = nil
	}
	w.Sessions = sessions
	return nil
}

// CapOutputTokens lowers every turn's max_tokens to at most n (and its working set with it).
func (w *Workload) CapOutputTokens(n int) {
	for i := range w.Sessions {
		for j := range w.Sessions[i].Turns {
			t := &w.Sessions[i].Turns[j]
			if t.MaxTokens > n {
				if t.Tokens > 0 {
					t.Tokens -= t.MaxTokens - n
				}
				t.MaxTokens = n
			}
		}
	}
}
