package bench

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// A hand-made trace whose sessions are known:
//
//	0: [1 2 3]      new session A
//	1: [1 4 5]      shares one block with 0: new session B
//	2: [1 2 3 6]    shares three blocks with 0: A
//	3: [1 4 5 7]    shares three with 1: B
//	4: [1 2 9]      shares two with 0 and with 2; 2 is more recent: A
//	5: [8 2 3]      shares nothing at the start: new session C
//	6: [1 4 5 7 10] shares four with 3: B
const handTrace = `{"timestamp": 0, "input_length": 1300, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 100, "input_length": 1400, "output_length": 20, "hash_ids": [1, 4, 5]}
{"timestamp": 250, "input_length": 1800, "output_length": 30, "hash_ids": [1, 2, 3, 6]}

{"timestamp": 300, "input_length": 2000, "output_length": 40, "hash_ids": [1, 4, 5, 7]}
{"timestamp": 400, "input_length": 1100, "output_length": 50, "hash_ids": [1, 2, 9]}
{"timestamp": 500, "input_length": 1536, "output_length": 60, "hash_ids": [8, 2, 3]}
{"timestamp": 900, "input_length": 2100, "output_length": 70, "hash_ids": [1, 4, 5, 7, 10]}
`

func TestMooncakeInfersSessionsByLongestSharedPrefix(t *testing.T) {
	recs, err := ReadMooncake(strings.NewReader(handTrace), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := InferSessions(recs, MooncakeMinSharedBlocks)
	if want := []int{0, 1, 0, 1, 0, 2, 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("sessions %v, want %v", got, want)
	}
	// With a one-block minimum, the common first block joins everything that starts with it.
	if got := InferSessions(recs, 1); !reflect.DeepEqual(got, []int{0, 0, 0, 0, 0, 1, 0}) {
		t.Fatalf("min 1 block: sessions %v", got)
	}
}

func TestMooncakeMostRecentOfEqualMatchesWins(t *testing.T) {
	// 0 and 1 start separate sessions only by construction: 2 shares two blocks with both, and
	// must join 1, the more recent.
	recs := []MooncakeRecord{
		{InputLength: 10, HashIDs: []int64{5, 6, 7}},
		{InputLength: 10, HashIDs: []int64{9}},
		{InputLength: 10, HashIDs: []int64{5, 6, 8}},
		{InputLength: 10, HashIDs: []int64{5, 6, 9}},
	}
	if got := InferSessions(recs, 2); !reflect.DeepEqual(got, []int{0, 1, 0, 0}) {
		t.Fatalf("sessions %v", got)
	}
	recs[1].HashIDs = []int64{5, 6, 1}
	if got := InferSessions(recs, 2); !reflect.DeepEqual(got, []int{0, 0, 0, 0}) {
		t.Fatalf("sessions %v", got)
	}
}

func TestMooncakeEqualHashIDsGiveEqualPrefixes(t *testing.T) {
	recs, _ := ReadMooncake(strings.NewReader(handTrace), 0, 0)
	w, err := Mooncake(recs, MooncakeConfig{BlockScale: 0.125, OutputScale: 1, Speedup: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 3 || w.Requests() != 7 || !w.Paced {
		t.Fatalf("%d sessions, %d requests, paced %v", len(w.Sessions), w.Requests(), w.Paced)
	}
	a := w.Sessions[0].Turns // requests 0, 2, 4
	// Request 0's last block is cut to the remainder; in request 2 the same id is whole.
	if !reflect.DeepEqual(a[0].Append[:2], a[1].Append[:2]) || !strings.HasPrefix(a[1].Append[2].Content, a[0].Append[2].Content) {
		t.Fatal("request 2 does not start with request 0's blocks")
	}
	if !reflect.DeepEqual(a[0].Append[:2], a[2].Append[:2]) || a[0].Append[2] == a[2].Append[2] {
		t.Fatal("requests 0 and 4 should share exactly two blocks")
	}
	// Request 5 has blocks 2 and 3 at the same positions as request 0: same text.
	c := w.Sessions[2].Turns[0].Append
	if c[1] != a[0].Append[1] || c[0] == a[0].Append[0] {
		t.Fatal("equal ids must give equal blocks, other ids other blocks")
	}
	// 64-token blocks; a last block holds the remainder; every turn is fresh with its output.
	if n := len(strings.Fields(a[0].Append[0].Content)); n != 64 {
		t.Fatalf("block of %d words, want 64", n)
	}
	if n := len(strings.Fields(a[0].Append[2].Content)); n != 163-128 {
		t.Fatalf("last block of %d words, want %d", n, 163-128)
	}
	if !strings.HasPrefix(BlockText(3, 64), BlockText(3, 34)) {
		t.Fatal("a cut block is not a prefix of the whole block")
	}
	if !a[1].Fresh || a[1].MaxTokens != 30 || !a[1].IgnoreEOS || a[1].At != 125*time.Millisecond {
		t.Fatalf("turn %+v", a[1])
	}
}

func TestReadMooncakeWindow(t *testing.T) {
	recs, err := ReadMooncake(strings.NewReader(handTrace), 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].Timestamp != 250 || recs[2].Timestamp != 400 {
		t.Fatalf("window %+v", recs)
	}
	if _, err := ReadMooncake(strings.NewReader(`{"timestamp": 0, "hash_ids": []}`), 0, 0); err == nil {
		t.Fatal("a request without hash_ids was accepted")
	}
}
