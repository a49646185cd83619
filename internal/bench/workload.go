package bench

import (
	"encoding/json"
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
