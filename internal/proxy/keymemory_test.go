package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// A large request's history key is written into its body's memory, which the next large body
// reuses once the request ended: what the policy keeps of the key must be its own copy. A
// conversation of 100 KB, then another as large, then the first one's next turn: the turn goes to
// the worker that served the first, by its prefix, whole.
func TestAKeyWrittenInBodyMemoryIsNotReadAfterTheBodyIsReused(t *testing.T) {
	a, b := okWorker(t, "a"), okWorker(t, "b")
	tp := newTestProxy(t, setup{policy: cacheAwarePolicy(), urls: []string{a.URL, b.URL}})

	chat := func(system string, turns ...string) string {
		msgs := []map[string]string{{"role": "system", "content": system}}
		for i, turn := range turns {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]string{"role": role, "content": turn})
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		return string(body)
	}
	large := func(word string) string { return strings.Repeat(word+" ", 100_000/(len(word)+1)) }

	status, first, body := tp.post(t, chatPath, chat(large("first"), "q1"))
	if status != http.StatusOK {
		t.Fatalf("first conversation: %d %s", status, body)
	}
	if status, _, body := tp.post(t, chatPath, chat(large("other"), "q1")); status != http.StatusOK {
		t.Fatalf("second conversation: %d %s", status, body)
	}
	status, next, body := tp.post(t, chatPath, chat(large("first"), "q1", "a1", "q2"))
	if status != http.StatusOK {
		t.Fatalf("first conversation's next turn: %d %s", status, body)
	}
	match, _ := strconv.ParseFloat(next.Get(HeaderPrefixMatch), 64)
	if next.Get(HeaderWorker) != first.Get(HeaderWorker) || match < 0.99 {
		t.Errorf("next turn went to %s (%s, prefix match %v), want %s by its whole prefix",
			next.Get(HeaderWorker), next.Get(HeaderDecision), match, first.Get(HeaderWorker))
	}
}
