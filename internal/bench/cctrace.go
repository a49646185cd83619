package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
)

// cctrace.go replays hash-only agent session traces in kv-cache-tester's format (real Claude Code
// sessions, converted to token counts and block hash ids): one JSON object per file, one file per
// session. See docs/benchmarks.md for the data, and how the replay is built:
//
//   - every request becomes a fresh conversation of one user message per hash id, whose text
//     depends only on the id (and, for ids of "local" scope, on the file), rendered to exactly
//     one block of the simulator's cache: equal leading ids are equal leading messages, for the
//     workers' prefix caches and the routers' history keys alike, and a request that extends the
//     previous one extends its conversation;
//   - a "subagent" entry, with its own requests, is a session of its own, next after its
//     parent's in the start order;
//   - of each adjacent pair of requests with identical hash ids (the capturing proxy sent every
//     turn twice, streamed then not), one is replayed: the second, after the first one's pause;
//   - a session ends before its first request longer than the block limit;
//   - each request's pause before it (think_time, or its gap after the previous request's end)
//     is capped, then scaled by a factor, 0 for back to back.

// CCTraceBlockTokens is the number of tokens one hash id stands for in the traces.
const CCTraceBlockTokens = 64

// MaxCCTraceFileBytes bounds a trace file: a larger one is refused before it is read. (The set
// in shared data keeps upstream's files below 4 MiB; the bound leaves room for longer sessions.)
const MaxCCTraceFileBytes = 64 << 20

// ccTemplateTokens are the tokens the simulator's chat template adds around a message's content
// ("<|user|>\n" and "<|end|>\n", three pseudo-tokens each), so that a message of blockTokens-6
// words is exactly one block.
const ccTemplateTokens = 6

// CCTraceConfig shapes a replay of trace sessions.
type CCTraceConfig struct {
	// BlockTokens is the length of each trace block in the replay, in pseudo-tokens: the
	// simulated workers' block size, so that each block of the trace is one block of their cache.
	// Prompts and outputs are scaled by BlockTokens/64 alike.
	BlockTokens int
	// ThinkScale multiplies every pause between a session's requests; 0 sends them back to back.
	ThinkScale float64
	// MaxThink caps every pause, in the trace's time, before ThinkScale: a session left open for
	// days would otherwise hold the replay that long. 0 leaves the pauses as they are.
	MaxThink time.Duration
	// MaxBlocks ends a session before its first request of more hash ids; 0 keeps every request.
	MaxBlocks int
}

// CCTraceFile is one trace file: one session and its sub-agents.
type CCTraceFile struct {
	ID        string           `json:"id"`
	BlockSize int              `json:"block_size"`
	Scope     string           `json:"hash_id_scope"` // "global" or "local"
	Requests  []CCTraceRequest `json:"requests"`
}

// CCTraceRequest is one request of a trace, or (Type "subagent") a sub-agent with its own.
type CCTraceRequest struct {
	T         float64          `json:"t"` // seconds since the session began
	Type      string           `json:"type"`
	In        int              `json:"in"`
	Out       int              `json:"out"`
	HashIDs   []int64          `json:"hash_ids"`
	APITime   *float64         `json:"api_time"`
	ThinkTime *float64         `json:"think_time"`
	AgentID   string           `json:"agent_id"`
	Requests  []CCTraceRequest `json:"requests"`
}

// ReadCCTraces reads the trace files at path: a directory (its *.json files, in name order; the
// set's tar.xz unpacked) or one file. With files above 0, that many of a directory's files are
// drawn by seed (and read in name order), the others not even opened. A file larger than
// MaxCCTraceFileBytes is an error, found before it is read.
func ReadCCTraces(path string, files int, seed uint64) ([]CCTraceFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	names := []string{path}
	if st.IsDir() {
		if names, err = filepath.Glob(filepath.Join(path, "*.json")); err != nil {
			return nil, err
		}
		slices.Sort(names)
		if len(names) == 0 {
			return nil, fmt.Errorf("%s: no .json trace file (unpack the set with tar xJf first)", path)
		}
		if files > 0 && files < len(names) {
			pick := rand.New(rand.NewPCG(seed, 0xcc)).Perm(len(names))[:files]
			slices.Sort(pick)
			chosen := make([]string, len(pick))
			for k, i := range pick {
				chosen[k] = names[i]
			}
			names = chosen
		}
	} else if strings.HasSuffix(path, ".xz") {
		return nil, fmt.Errorf("%s: unpack the set first (tar xJf) and give its directory", path)
	}
	out := make([]CCTraceFile, 0, len(names))
	for _, f := range names {
		tf, err := readCCTraceFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, tf)
	}
	return out, nil
}

func readCCTraceFile(path string) (CCTraceFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return CCTraceFile{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return CCTraceFile{}, err
	}
	if st.Size() > MaxCCTraceFileBytes {
		return CCTraceFile{}, fmt.Errorf("%s: %d bytes, more than the %d a trace file may have", path, st.Size(), MaxCCTraceFileBytes)
	}
	tf, err := ParseCCTrace(io.LimitReader(f, MaxCCTraceFileBytes))
	if err != nil {
		return CCTraceFile{}, fmt.Errorf("%s: %w", path, err)
	}
	if tf.ID == "" {
		tf.ID = strings.TrimSuffix(filepath.Base(path), ".json")
	}
	return tf, nil
}

// ParseCCTrace reads one trace file's JSON and checks what the replay relies on.
func ParseCCTrace(r io.Reader) (CCTraceFile, error) {
	var tf CCTraceFile
	if err := json.NewDecoder(r).Decode(&tf); err != nil {
		return CCTraceFile{}, fmt.Errorf("trace: %w", err)
	}
	if tf.BlockSize != CCTraceBlockTokens {
		return CCTraceFile{}, fmt.Errorf("trace %s: block_size %d, want %d", tf.ID, tf.BlockSize, CCTraceBlockTokens)
	}
	switch tf.Scope {
	case "global", "local":
	default:
		return CCTraceFile{}, fmt.Errorf("trace %s: hash_id_scope %q, want global or local", tf.ID, tf.Scope)
	}
	return tf, nil
}

// ccSession is one session of a trace as the replay sends it.
type ccSession struct {
	id        string
	namespace uint64 // 0 for global ids; else the file's, so that its local ids are its own
	requests  []ccRequest
}

type ccRequest struct {
	ids   []int64
	out   int           // output tokens, in the trace's tokens
	think time.Duration // pause after the previous request's end
}

// ccSessions returns the sessions of one file: the top-level one, then each sub-agent's, in the
// order they appear. Requests of each are deduplicated and cut at maxBlocks.
func ccSessions(tf *CCTraceFile, maxBlocks int) []ccSession {
	ns := uint64(0)
	if tf.Scope == "local" {
		ns = kvcache.HashBytes([]byte(tf.ID)) | 1
	}
	var out []ccSession
	var walk func(id string, reqs []CCTraceRequest, depth int)
	walk = func(id string, reqs []CCTraceRequest, depth int) {
		s := ccSession{id: id, namespace: ns}
		var own []CCTraceRequest
		var subs []CCTraceRequest
		for _, r := range reqs {
			if r.Type == "subagent" {
				subs = append(subs, r)
				continue
			}
			own = append(own, r)
		}
		s.requests = ccRequests(own, maxBlocks)
		if len(s.requests) > 0 {
			out = append(out, s)
		}
		if depth >= maxSubagentDepth {
			return
		}
		for k, sub := range subs {
			name := sub.AgentID
			if name == "" {
				name = fmt.Sprintf("agent-%d", k)
			}
			walk(id+"/"+name, sub.Requests, depth+1)
		}
	}
	walk(tf.ID, tf.Requests, 0)
	return out
}

// maxSubagentDepth bounds the nesting of sub-agents followed.
const maxSubagentDepth = 8

// ccRequests turns one session's requests (sub-agent entries taken out) into the replayed ones:
// the first of each adjacent pair with identical hash ids dropped, its pause kept for the second;
// cut before the first request longer than maxBlocks.
func ccRequests(reqs []CCTraceRequest, maxBlocks int) []ccRequest {
	var out []ccRequest
	var pending time.Duration // the pause of a dropped duplicate, for its twin
	hasPending := false
	for i := range reqs {
		r := &reqs[i]
		if len(r.HashIDs) == 0 {
			continue
		}
		if maxBlocks > 0 && len(r.HashIDs) > maxBlocks {
			break
		}
		think := pause(reqs, i)
		if hasPending {
			think, hasPending = pending, false
		}
		if i+1 < len(reqs) && slices.Equal(r.HashIDs, reqs[i+1].HashIDs) {
			pending, hasPending = think, true
			continue
		}
		out = append(out, ccRequest{ids: r.HashIDs, out: r.Out, think: think})
	}
	if len(out) > 0 {
		out[0].think = 0 // a session's start is the replay's to choose
	}
	return out
}

// pause is the time between the end of request i-1 and the start of request i: its think_time,
// else its start less the previous request's start and duration, else the gap between starts.
func pause(reqs []CCTraceRequest, i int) time.Duration {
	r := &reqs[i]
	secs := 0.0
	switch {
	case r.ThinkTime != nil:
		secs = *r.ThinkTime
	case i > 0 && reqs[i-1].APITime != nil:
		secs = r.T - reqs[i-1].T - *reqs[i-1].APITime
	case i > 0:
		secs = r.T - reqs[i-1].T
	}
	if !(secs > 0) || math.IsInf(secs, 0) {
		return 0
	}
	return time.Duration(secs * float64(time.Second))
}

// CCTrace builds the workload: the sessions of every file, in order, each file's sub-agents right
// after its own. Each request is a fresh
// conversation of one message per hash id (see ccBlockText), asking exactly its output tokens
// scaled as its blocks are; its working set (prompt and output tokens) is recorded for the
// oversubscription figures.
func CCTrace(files []CCTraceFile, c CCTraceConfig) (Workload, error) {
	if c.BlockTokens <= ccTemplateTokens {
		return Workload{}, fmt.Errorf("cctrace: %d tokens per block leave no room for text beside the chat template's %d; give --block-size above %d", c.BlockTokens, ccTemplateTokens, ccTemplateTokens)
	}
	if c.ThinkScale < 0 || math.IsNaN(c.ThinkScale) || math.IsInf(c.ThinkScale, 0) || c.MaxBlocks < 0 || c.MaxThink < 0 {
		return Workload{}, errors.New("cctrace: --think-scale, --max-think and --max-blocks must not be negative")
	}
	var all []ccSession
	for i := range files {
		all = append(all, ccSessions(&files[i], c.MaxBlocks)...)
	}
	if len(all) == 0 {
		return Workload{}, errors.New("cctrace: no request to replay (is --max-blocks below every first request?)")
	}
	scale := float64(c.BlockTokens) / CCTraceBlockTokens
	texts := map[ccBlock]string{}
	seen := map[ccBlock]bool{}
	var reused, blocks int64
	w := Workload{Name: "cctrace"}
	for _, s := range all {
		ws := Session{ID: s.id}
		var prevIDs []int64
		var prevMsgs []Message
		for _, r := range s.requests {
			// A request that extends the previous one shares its messages: only the new ids
			// are rendered, and the workload stays about the size of each session's longest
			// request.
			p := commonPrefix(prevIDs, r.ids)
			msgs := prevMsgs[:p:p]
			if p == len(prevMsgs) {
				msgs = prevMsgs
			}
			for _, id := range r.ids[p:] {
				b := ccBlock{s.namespace, id}
				t, ok := texts[b]
				if !ok {
					t = ccBlockText(b, c.BlockTokens-ccTemplateTokens)
					texts[b] = t
				}
				msgs = append(msgs, Message{Role: "user", Content: t})
			}
			prevIDs, prevMsgs = r.ids, msgs
			hit := 0
			for hit < len(r.ids) && seen[ccBlock{s.namespace, r.ids[hit]}] {
				hit++
			}
			reused += int64(hit)
			blocks += int64(len(r.ids))
			for _, id := range r.ids[hit:] {
				seen[ccBlock{s.namespace, id}] = true
			}
			out := max(1, int(math.Round(float64(r.out)*scale)))
			think := r.think
			if c.MaxThink > 0 {
				think = min(think, c.MaxThink)
			}
			ws.Turns = append(ws.Turns, Turn{Append: msgs, Fresh: true, IgnoreEOS: true, MaxTokens: out,
				Think: time.Duration(float64(think) * c.ThinkScale), Tokens: len(r.ids)*c.BlockTokens + out})
		}
		w.Sessions = append(w.Sessions, ws)
	}
	ceiling := HitRate(reused, blocks)
	w.ReuseCeiling = &ceiling
	return w, nil
}

// commonPrefix is the number of leading elements a and b share.
func commonPrefix(a, b []int64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// ccBlock names the content of one trace block: its hash id in its file's namespace (0 for
// global ids).
type ccBlock struct {
	namespace uint64
	id        int64
}

// ccBlockText is the text of a block: n words drawn from a generator seeded by the block's
// name, so the same block has the same text in every request and every session that holds it.
func ccBlockText(b ccBlock, n int) string {
	return wordText(rand.New(rand.NewPCG(uint64(b.id), 0xcc7ace^b.namespace)), n)
}
