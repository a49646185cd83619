package residency

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// pair is two trackers, as two replicas' policies hold them, sharing their changes as the
// router's broadcast does.
func pair(c *testkit.Clock) (a, b *Tracker) {
	opts := Options{Now: c.Now, MinLive: time.Second, MaxLive: time.Minute, FirstLive: 10 * time.Second}
	oa, ob := opts, opts
	oa.OnChange = func(ch Change) { b.Apply(decoded(ch)) }
	ob.OnChange = func(ch Change) { a.Apply(decoded(ch)) }
	a, b = New(oa), New(ob)
	for _, tr := range []*Tracker{a, b} {
		tr.SetCapacity("w1", 1000)
		tr.SetCapacity("w2", 1000)
	}
	return a, b
}

// decoded is ch after a trip through its encoding.
func decoded(ch Change) Change {
	got, rest, err := ReadChange(ch.Append(nil))
	if err != nil || len(rest) != 0 {
		panic(err)
	}
	return got
}

func TestReplicasSharingTheirChangesSeeTheSameRoom(t *testing.T) {
	c := testkit.NewClock()
	a, b := pair(c)
	a.Started("s1", "w1", 500)
	b.Started("s2", "w1", 300)
	for _, tr := range []*Tracker{a, b} {
		if room, _ := tr.Room("w1"); room != 900-800 {
			t.Fatalf("room on w1 %d, want 100: both replicas' turns in flight count", room)
		}
	}
	a.Ended("s1", 500, 100, true)
	b.Ended("s2", 300, 50, true)
	// b's next turn of s1 (placed by a) moves it to w2; a sees it there.
	b.Started("s1", "w2", 700)
	if s, _ := a.Session("s1"); s.Worker != "w2" || s.Tokens != 700 {
		t.Fatalf("a sees s1 on %s with %d tokens, want w2 with 700", s.Worker, s.Tokens)
	}
	if a.FitsOn("w2", 300) || b.FitsOn("w2", 300) {
		t.Fatal("w2 takes 300 more tokens over s1's 700 in flight, past 900 of room")
	}
	b.Ended("s1", 700, 10, true)
	a.Evicted("s2")
	if s, _ := b.Session("s2"); s.Resident {
		t.Fatal("s2 evicted on a's word is still resident on b's")
	}
	a.Forget("s1")
	if _, ok := b.Session("s1"); ok {
		t.Fatal("s1 forgotten by a is still followed by b")
	}
}

func TestATurnAnotherReplicaStartedStopsCountingWhenItsEndIsLost(t *testing.T) {
	c := testkit.NewClock()
	tr := New(Options{Now: c.Now, MinLive: time.Second, MaxLive: time.Minute, FirstLive: 10 * time.Second})
	tr.SetCapacity("w", 1000)
	tr.Apply(Change{Kind: ChangeStarted, Key: "remote", Worker: "w", Prompt: 800})
	tr.Started("local", "w", 100)
	c.Advance(2 * time.Minute) // both still in flight, as far as this tracker knows
	if s, _ := tr.Session("remote"); s.Live {
		t.Fatal("a remote turn whose end never came is live past MaxLive")
	}
	if s, _ := tr.Session("local"); !s.Live {
		t.Fatal("this replica's own turn in flight stopped being live")
	}
}

func TestAChangeReadsBackAsWritten(t *testing.T) {
	for _, ch := range []Change{
		{Kind: ChangeStarted, Key: "k", Worker: "http://127.0.0.1:8000", Prompt: 123456},
		{Kind: ChangeEnded, Key: "k", Prompt: 5, Output: 7, OK: true},
		{Kind: ChangeEvicted, Key: "k"},
		{Kind: ChangeForgotten, Key: strings.Repeat("x", MaxChangeString)},
	} {
		b := ch.Append([]byte("prefix"))
		got, rest, err := ReadChange(append(b[len("prefix"):], "tail"...))
		if err != nil || got != ch || string(rest) != "tail" {
			t.Fatalf("%+v read back as %+v, rest %q, %v", ch, got, rest, err)
		}
	}
	if b := (Change{Kind: ChangeEvicted, Key: strings.Repeat("x", MaxChangeString+1)}).Append(nil); len(b) != 0 {
		t.Fatalf("a change with a key over the bound was written (%d bytes)", len(b))
	}
}

func TestMalformedChangesAreRefused(t *testing.T) {
	valid := Change{Kind: ChangeStarted, Key: "k", Worker: "w", Prompt: 1}.Append(nil)
	for name, b := range map[string][]byte{
		"empty":          nil,
		"unknown kind":   append([]byte{9}, valid[1:]...),
		"truncated":      valid[:len(valid)-1],
		"huge length":    {byte(ChangeEvicted), 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"no key":         Change{Kind: ChangeEvicted}.Append(nil),
		"start nowhere":  Change{Kind: ChangeStarted, Key: "k"}.Append(nil),
		"overlong count": bytes.Repeat([]byte{0xff}, 12),
	} {
		if _, _, err := ReadChange(b); err == nil {
			t.Errorf("%s: read without error", name)
		}
	}
}

func FuzzReadChange(f *testing.F) {
	f.Add(Change{Kind: ChangeStarted, Key: "k", Worker: "w", Prompt: 9}.Append(nil))
	f.Add(Change{Kind: ChangeEnded, Key: "k", Prompt: 9, Output: 3, OK: true}.Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, rest, err := ReadChange(b)
		if err != nil {
			return
		}
		if len(c.Key) > MaxChangeString || len(c.Worker) > MaxChangeString || len(rest) > len(b) {
			t.Fatalf("read %+v past the bounds", c)
		}
		again, _, err := ReadChange(c.Append(nil))
		if err != nil || again != c {
			t.Fatalf("%+v does not read back: %+v, %v", c, again, err)
		}
	})
}
