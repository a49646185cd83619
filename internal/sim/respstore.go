package sim

import (
	"container/list"
	"encoding/json"
	"sync"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// The bounds of a worker's store of Responses API responses. A real vLLM
// worker keeps every stored response forever (its store is a plain dict); a
// simulated worker runs in tests, benchmarks and demos for hours, so it keeps
// the most recently used ones only. Past either bound the least recently
// used response (created, read or continued last the longest ago) is
// forgotten, and continuing from it gets the same 404 as an id the worker
// never stored.
const (
	maxStoredResponses = 4096
	// maxStoredBytes bounds the text the stored conversations hold, counted
	// per response: a conversation that several stored responses share is
	// counted once for each of them.
	maxStoredBytes = 256 << 20
)

// storedResponse is what a worker keeps of a response created with store
// true: enough to answer GET and input_items, and to rebuild the whole
// prompt of a turn that names it as previous_response_id.
type storedResponse struct {
	resp *responseObject // as answered, completed
	// history is the conversation the response answered, without its
	// instructions: its predecessor's history and output, then its own
	// input. It is shared with the responses that continue it and never
	// modified.
	history []prompt.Message
	// input is the response's own input items as the client sent them, each
	// given an id, for input_items.
	input []json.RawMessage
	size  int
}

// responseStore is an LRU of stored responses, bounded by count and bytes.
// It is safe for concurrent use.
type responseStore struct {
	mu         sync.Mutex
	byID       map[string]*list.Element // of *storedResponse
	lru        list.List                // front: most recently used
	bytes      int
	maxEntries int
	maxBytes   int
}

func newResponseStore(maxEntries, maxBytes int) *responseStore {
	return &responseStore{byID: make(map[string]*list.Element), maxEntries: maxEntries, maxBytes: maxBytes}
}

// get returns the stored response id and marks it used.
func (s *responseStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	s.lru.MoveToFront(e)
	return e.Value.(*storedResponse), true
}

// put stores sr under its response id, then forgets the least recently used
// responses until both bounds hold again. A response larger than the whole
// byte budget is not kept.
func (s *responseStore) put(sr *storedResponse) {
	sr.size = storedSize(sr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byID[sr.resp.ID]; ok {
		s.remove(old)
	}
	s.byID[sr.resp.ID] = s.lru.PushFront(sr)
	s.bytes += sr.size
	for s.lru.Len() > s.maxEntries || s.bytes > s.maxBytes {
		s.remove(s.lru.Back())
	}
}

// delete forgets id and reports whether it was stored.
func (s *responseStore) delete(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if ok {
		s.remove(e)
	}
	return ok
}

func (s *responseStore) remove(e *list.Element) {
	sr := s.lru.Remove(e).(*storedResponse)
	delete(s.byID, sr.resp.ID)
	s.bytes -= sr.size
}

func (s *responseStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}

// storedSize is the number of bytes sr is charged: the text of its history,
// its input items and its output, plus a fixed share per message for the
// structures around them.
func storedSize(sr *storedResponse) int {
	const perMessage = 64
	n := 0
	for i := range sr.history {
		m := &sr.history[i]
		n += perMessage + len(m.Role) + len(m.Content)
		for _, tc := range m.ToolCalls {
			n += len(tc.Name) + len(tc.Arguments)
		}
	}
	for _, raw := range sr.input {
		n += perMessage + len(raw)
	}
	for _, it := range sr.resp.Output {
		n += perMessage
		switch it := it.(type) {
		case *respMessage:
			for _, c := range it.Content {
				n += len(c.Text)
			}
		case *respFunctionCall:
			n += len(it.Name) + len(it.Arguments)
		}
	}
	return n
}
