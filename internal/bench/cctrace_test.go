package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// handCCTrace is one session in the trace format: a streamed request and its non-streamed twin
// (identical hash ids, the capture's duplicate) with a sub-agent's entry between them, then two
// more requests, the last of them longer than the others.
const handCCTrace = `{"id": "trace_hand", "block_size": 64, "hash_id_scope": "global", "requests": [
 {"t": 0, "type": "s", "in": 200, "out": 30, "hash_ids": [1, 2, 3], "api_time": 2, "think_time": 0},
 {"t": 2.5, "type": "subagent", "agent_id": "agent_007", "requests": [
   {"t": 0, "type": "s", "in": 130, "out": 64, "hash_ids": [1, 50], "think_time": 0},
   {"t": 4, "type": "n", "in": 200, "out": 640, "hash_ids": [1, 50, 51], "think_time": 3}]},
 {"t": 3, "type": "n", "in": 200, "out": 40, "hash_ids": [1, 2, 3], "think_time": 1},
 {"t": 20, "type": "s", "in": 330, "out": 128, "hash_ids": [1, 2, 3, 4, 5], "api_time": 5, "think_time": 15},
 {"t": 40, "type": "n", "in": 460, "out": 64, "hash_ids": [1, 2, 3, 4, 5, 6, 7]}]}`

func parseHand(t *testing.T, trace string) CCTraceFile {
	t.Helper()
	tf, err := ParseCCTrace(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	return tf
}

func TestCCTrace_SubagentsAreSessionsOfTheirOwnAfterTheirParent(t *testing.T) {
	w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range w.Sessions {
		ids = append(ids, s.ID)
	}
	if !slices.Equal(ids, []string{"trace_hand", "trace_hand/agent_007"}) {
		t.Fatalf("sessions %v, want the parent then its sub-agent", ids)
	}
	if n := len(w.Sessions[1].Turns); n != 2 {
		t.Fatalf("sub-agent has %d turns, want 2", n)
	}
	if got := len(w.Sessions[1].Turns[1].Append); got != 3 {
		t.Fatalf("sub-agent's second request has %d messages, want one per hash id (3)", got)
	}
}

func TestCCTrace_OfAPairWithIdenticalHashIDsOneIsSentAfterTheFirstsPause(t *testing.T) {
	w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16, ThinkScale: 1})
	if err != nil {
		t.Fatal(err)
	}
	turns := w.Sessions[0].Turns
	var blocks []int
	for _, tu := range turns {
		blocks = append(blocks, len(tu.Append))
	}
	if !slices.Equal(blocks, []int{3, 5, 7}) {
		t.Fatalf("parent's requests have %v blocks, want [3 5 7]: the s/n twins sent once", blocks)
	}
	// The twin kept is the second (its output, 40 tokens, is 10 at 16 tokens a block).
	if turns[0].MaxTokens != 10 {
		t.Fatalf("first turn asks %d tokens, want the kept twin's 40 scaled to 10", turns[0].MaxTokens)
	}
	// The pause before the last request is the gap after the previous one's end: 40 - (20 + 5).
	if turns[1].Think != 15*time.Second || turns[2].Think != 15*time.Second {
		t.Fatalf("pauses %v and %v, want 15s (think_time) and 15s (the gap)", turns[1].Think, turns[2].Think)
	}
}

func TestCCTrace_ThinkScaleMultipliesThePausesCappedAtMaxThinkAndZeroSendsBackToBack(t *testing.T) {
	for _, c := range []struct {
		scale float64
		max   time.Duration
		want  time.Duration
	}{{0, 0, 0}, {0.1, 0, 1500 * time.Millisecond}, {0.1, 10 * time.Second, time.Second}} {
		w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16, ThinkScale: c.scale, MaxThink: c.max})
		if err != nil {
			t.Fatal(err)
		}
		if got := w.Sessions[0].Turns[1].Think; got != c.want {
			t.Fatalf("think scale %v, cap %v: pause %v, want %v", c.scale, c.max, got, c.want)
		}
		if got := w.Sessions[0].Turns[0].Think; got != 0 {
			t.Fatalf("think scale %v: the session's first request waits %v", c.scale, got)
		}
	}
}

func TestCCTrace_ASessionEndsBeforeItsFirstRequestOverTheBlockLimit(t *testing.T) {
	w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16, MaxBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(w.Sessions[0].Turns); n != 1 {
		t.Fatalf("parent kept %d requests under a 4-block limit, want 1", n)
	}
	if n := len(w.Sessions[1].Turns); n != 2 {
		t.Fatalf("sub-agent kept %d requests, want both (3 blocks at most)", n)
	}
	if _, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 16, MaxBlocks: 1}); err == nil {
		t.Fatal("a limit below every first request gave a workload")
	}
}

// TestCCTrace_EachTraceBlockIsOneSimulatorBlock renders two requests through the simulator's
// chat template and checks that they share exactly the blocks of their common hash ids.
func TestCCTrace_EachTraceBlockIsOneSimulatorBlock(t *testing.T) {
	for _, bs := range []int{8, 16, 32} {
		w, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: bs})
		if err != nil {
			t.Fatal(err)
		}
		render := func(tu Turn) []uint64 {
			var seq prompt.Sequence
			msgs := make([]prompt.Message, len(tu.Append))
			for i, m := range tu.Append {
				msgs[i] = prompt.Message{Role: m.Role, Content: m.Content}
			}
			prompt.RenderChat(&seq, nil, msgs, true)
			if full := seq.Len() / bs; full != len(tu.Append) {
				t.Fatalf("block size %d: %d messages render to %d tokens, %d full blocks", bs, len(tu.Append), seq.Len(), full)
			}
			return kvcache.BlockHashes(nil, kvcache.Root(""), seq.Text, seq.Ends, bs)
		}
		turns := w.Sessions[0].Turns
		a, b := render(turns[1]), render(turns[2]) // hash ids [1..5] and [1..7]
		if !slices.Equal(a, b[:5]) {
			t.Fatalf("block size %d: the longer request does not start with the shorter one's 5 blocks", bs)
		}
		sub := render(w.Sessions[1].Turns[1]) // [1 50 51]: shares id 1 with the parent
		if sub[0] != a[0] || sub[1] == a[1] {
			t.Fatalf("block size %d: a request sharing only the first hash id shares %v blocks", bs, []bool{sub[0] == a[0], sub[1] == a[1]})
		}
		if want := len(turns[2].Append)*bs + turns[2].MaxTokens; turns[2].Tokens != want {
			t.Fatalf("block size %d: working set %d, want %d (prompt blocks and output)", bs, turns[2].Tokens, want)
		}
	}
	if _, err := CCTrace([]CCTraceFile{parseHand(t, handCCTrace)}, CCTraceConfig{BlockTokens: 6}); err == nil {
		t.Fatal("6 tokens a block (all of them template) gave a workload")
	}
}

// Two files sharing hash ids 1 and 2:
//
//	A: [1 2 3]  [1 2 3 4 5]
//	B: [1 2 9]  [1 2 9 10]
const (
	ceilingA = `{"id": "A", "block_size": 64, "hash_id_scope": "%s", "requests": [
 {"t": 0, "type": "n", "in": 192, "out": 10, "hash_ids": [1, 2, 3]},
 {"t": 9, "type": "n", "in": 320, "out": 10, "hash_ids": [1, 2, 3, 4, 5]}]}`
	ceilingB = `{"id": "B", "block_size": 64, "hash_id_scope": "%s", "requests": [
 {"t": 0, "type": "n", "in": 192, "out": 10, "hash_ids": [1, 2, 9]},
 {"t": 9, "type": "n", "in": 256, "out": 10, "hash_ids": [1, 2, 9, 10]}]}`
)

func TestCCTrace_ReuseCeilingCountsTheLeadingBlocksAnEarlierRequestHad(t *testing.T) {
	for _, c := range []struct {
		scope string
		want  float64
	}{
		// global: A1 0 of 3, A2 3 of 5, B1 2 of 3 (1 and 2 from A), B2 3 of 4: 8/15.
		{"global", 8.0 / 15},
		// local: B's ids are B's own: B1 0 of 3, B2 3 of 4: 6/15.
		{"local", 6.0 / 15},
	} {
		files := []CCTraceFile{
			parseHand(t, strings.ReplaceAll(ceilingA, "%s", c.scope)),
			parseHand(t, strings.ReplaceAll(ceilingB, "%s", c.scope)),
		}
		w, err := CCTrace(files, CCTraceConfig{BlockTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		if w.ReuseCeiling == nil || *w.ReuseCeiling != c.want {
			t.Fatalf("%s: ceiling %v, want %v", c.scope, w.ReuseCeiling, c.want)
		}
		sameText := w.Sessions[0].Turns[0].Append[0].Content == w.Sessions[1].Turns[0].Append[0].Content
		if sameText != (c.scope == "global") {
			t.Fatalf("%s: hash id 1 has the same text in both files: %v", c.scope, sameText)
		}
	}
}

func TestReadCCTraces_DrawsFilesBySeedAndKeepsTheirOrder(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		trace := strings.Replace(strings.ReplaceAll(ceilingA, "%s", "global"), `"A"`, `"`+id+`"`, 1)
		if err := os.WriteFile(filepath.Join(dir, id+".json"), []byte(trace), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(seed uint64) []string {
		files, err := ReadCCTraces(dir, 3, seed)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range files {
			out = append(out, f.ID)
		}
		return out
	}
	first := ids(1)
	if len(first) != 3 || !slices.IsSorted(first) || !slices.Equal(first, ids(1)) {
		t.Fatalf("seed 1 drew %v then %v: want 3 files, in name order, the same each time", first, ids(1))
	}
	differs := false
	for seed := uint64(2); seed < 10 && !differs; seed++ {
		differs = !slices.Equal(ids(seed), first)
	}
	if !differs {
		t.Fatal("every seed draws the same files")
	}
	if all, err := ReadCCTraces(dir, 0, 1); err != nil || len(all) != 6 {
		t.Fatalf("no draw read %d files, %v; want all 6", len(all), err)
	}
}

func TestReadCCTraces_RefusesAFileOverTheBoundBeforeReadingIt(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.json"), []byte(strings.ReplaceAll(ceilingA, "%s", "global")), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := ReadCCTraces(dir, 0, 0)
	if err != nil || len(files) != 1 || files[0].ID != "A" {
		t.Fatalf("read %v, %v", files, err)
	}
	big := filepath.Join(dir, "b.json")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	// A sparse file: its size is over the bound, and nothing of it is JSON.
	if err := f.Truncate(MaxCCTraceFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := ReadCCTraces(dir, 0, 0); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("err %v, want the file refused for its size", err)
	}
}

func TestParseCCTrace_RefusesOtherBlockSizesAndScopes(t *testing.T) {
	for _, bad := range []string{
		`{"id": "x", "block_size": 16, "hash_id_scope": "global", "requests": []}`,
		`{"id": "x", "block_size": 64, "hash_id_scope": "session", "requests": []}`,
		`{"id": "x", "block_size": 64, "hash_id_scope": "global", "requests": [{"hash_ids": "1"}]}`,
	} {
		if _, err := ParseCCTrace(strings.NewReader(bad)); err == nil {
			t.Fatalf("accepted %s", bad)
		}
	}
}
