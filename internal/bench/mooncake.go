package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"
)

// MooncakeBlockTokens is the number of tokens one hash id stands for in a Mooncake trace.
const MooncakeBlockTokens = 512

// MooncakeConfig selects and scales a window of a Mooncake-format trace.
type MooncakeConfig struct {
	// BlockScale scales every block (and so every prompt): 0.125 turns 512-token blocks into
	// 64-token ones. Equal hash ids still give equal text.
	BlockScale float64
	// OutputScale scales each request's output_length.
	OutputScale float64
	// Speedup divides the trace's timestamps; 0 replays closed-loop (no pacing).
	Speedup float64
	// Offset skips that many requests; Limit keeps at most that many (0: all).
	Offset, Limit int
}

// MooncakeRecord is one line of a Mooncake trace.
type MooncakeRecord struct {
	Timestamp    float64 `json:"timestamp"` // milliseconds from the trace's start
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ReadMooncake reads the records of a JSONL trace from offset on, at most limit of them (0: all).
func ReadMooncake(r io.Reader, offset, limit int) ([]MooncakeRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 64<<20)
	var out []MooncakeRecord
	for line := 0; sc.Scan(); {
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		line++
		if line <= offset {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		var rec MooncakeRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("mooncake trace, request %d: %w", line, err)
		}
		if len(rec.HashIDs) == 0 || rec.InputLength < 1 {
			return nil, fmt.Errorf("mooncake trace, request %d: needs hash_ids and a positive input_length", line)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// InferSessions assigns every request a session: a request continues the session of the most
// recent earlier request with which it shares the longest hash_ids prefix, when that prefix is
// at least minShared blocks long; otherwise it starts a new session. It returns each request's
// session number (sessions are numbered in order of their first request).
//
// A trie of hash_ids prefixes remembers, at every node, the last request that passed through
// it: the deepest node a request reaches is its longest shared prefix, and that node's last
// request is the most recent request sharing it. The cost is linear in the total number of ids.
func InferSessions(recs []MooncakeRecord, minShared int) []int {
	type node struct {
		children map[int64]*node
		last     int
	}
	root := &node{children: map[int64]*node{}}
	session := make([]int, len(recs))
	sessions := 0
	for i, rec := range recs {
		n, depth := root, 0
		for _, id := range rec.HashIDs {
			c := n.children[id]
			if c == nil {
				break
			}
			n, depth = c, depth+1
		}
		if depth >= minShared && depth > 0 {
			session[i] = session[n.last]
		} else {
			session[i] = sessions
			sessions++
		}
		n = root
		for _, id := range rec.HashIDs {
			c := n.children[id]
			if c == nil {
				c = &node{children: map[int64]*node{}}
				n.children[id] = c
			}
			c.last = i
			n = c
		}
	}
	return session
}

// MooncakeMinSharedBlocks is the shortest shared prefix, in blocks, that ties two requests into
// one session; one block is usually just the common system prompt.
const MooncakeMinSharedBlocks = 2

// BlockText returns the text of hash id's block cut to its first n pseudo-tokens. The text
// depends only on the id, so equal ids give equal text and a cut block is a prefix of the full
// one.
func BlockText(id int64, n int) string {
	return wordText(rand.New(rand.NewPCG(uint64(id), 0xb10c)), n)
}

// Mooncake builds a workload from trace records: one session per inferred session, each request
// a fresh conversation of one user message per block (so equal leading blocks give equal
// leading messages, for the worker's cache and the router's history key alike), sent no earlier
// than its timestamp divided by the speedup.
func Mooncake(recs []MooncakeRecord, c MooncakeConfig) (Workload, error) {
	if c.BlockScale <= 0 || c.OutputScale <= 0 || c.Speedup < 0 {
		return Workload{}, fmt.Errorf("--block-scale and --output-scale must be positive, --speedup not negative")
	}
	block := max(1, int(math.Round(MooncakeBlockTokens*c.BlockScale)))
	sessionOf := InferSessions(recs, MooncakeMinSharedBlocks)
	w := Workload{Name: "mooncake", Paced: c.Speedup > 0}
	var t0 float64
	if len(recs) > 0 {
		t0 = recs[0].Timestamp
	}
	for i, rec := range recs {
		s := sessionOf[i]
		if s == len(w.Sessions) {
			w.Sessions = append(w.Sessions, Session{ID: fmt.Sprintf("mooncake-%d", i)})
		}
		total := max(1, int(math.Round(float64(rec.InputLength)*c.BlockScale)))
		msgs := make([]Message, len(rec.HashIDs))
		for k, id := range rec.HashIDs {
			n := block
			if k == len(rec.HashIDs)-1 {
				n = min(block, max(1, total-k*block))
			}
			msgs[k] = Message{Role: "user", Content: BlockText(id, n)}
		}
		turn := Turn{Append: msgs, Fresh: true, IgnoreEOS: true,
			MaxTokens: max(1, int(math.Round(float64(rec.OutputLength)*c.OutputScale)))}
		if c.Speedup > 0 {
			turn.At = time.Duration((rec.Timestamp - t0) / c.Speedup * float64(time.Millisecond))
		}
		w.Sessions[s].Turns = append(w.Sessions[s].Turns, turn)
	}
	return w, nil
}
