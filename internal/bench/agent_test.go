package bench

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func smallAgent(seed uint64) AgentConfig {
	c := DefaultAgentConfig()
	c.Sessions, c.Turns, c.SharedPrefixTokens, c.Seed = 5, 4, 200, seed
	return c
}

func TestAgentIsDeterministicForASeed(t *testing.T) {
	a, err := Agent(smallAgent(7))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Agent(smallAgent(7))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two workloads from the same seed differ")
	}
	c, _ := Agent(smallAgent(8))
	if reflect.DeepEqual(a.Sessions[0].Turns, c.Sessions[0].Turns) {
		t.Fatal("another seed gave the same first session")
	}
	// A session does not depend on how many sessions there are.
	more := smallAgent(7)
	more.Sessions = 9
	d, _ := Agent(more)
	if !reflect.DeepEqual(a.Sessions[3], d.Sessions[3]) {
		t.Fatal("session 3 changed with the number of sessions")
	}
}

func TestAgentSharesThePrefixAndKeepsTasksApart(t *testing.T) {
	w, _ := Agent(smallAgent(3))
	sys := w.Sessions[0].Turns[0].Append[0]
	if sys.Role != "system" || len(strings.Fields(sys.Content)) < 90 {
		t.Fatalf("first message %q is not a system prompt of about 100 words", sys.Role)
	}
	tasks := map[string]bool{}
	for _, s := range w.Sessions {
		if s.Turns[0].Append[0] != sys {
			t.Fatalf("session %s has another system prompt", s.ID)
		}
		if len(s.Tools) == 0 {
			t.Fatalf("session %s has no tools", s.ID)
		}
		tasks[s.Turns[0].Append[1].Content] = true
	}
	if len(tasks) != len(w.Sessions) {
		t.Fatalf("%d distinct tasks for %d sessions", len(tasks), len(w.Sessions))
	}
}

// Each turn's request is the previous request, then the server's actual reply, then the new
// messages.
func TestAgentTurnsExtendThePreviousTurnAndItsReply(t *testing.T) {
	w, _ := Agent(smallAgent(11))
	for _, s := range w.Sessions {
		var conv conversation
		var prev []Message
		for i := range s.Turns {
			next, fresh := conv.next(&s.Turns[i])
			msgs := messages(next)
			if fresh != len(msgs)-len(s.Turns[i].Append) {
				t.Fatalf("%s turn %d: own messages from %d of %d", s.ID, i, fresh, len(msgs))
			}
			if i > 0 {
				want := append(append([]Message(nil), prev...), Message{Role: "assistant", Content: fmt.Sprintf("reply %s %d", s.ID, i-1)})
				if len(msgs) != len(want)+len(s.Turns[i].Append) || !reflect.DeepEqual(msgs[:len(want)], want) {
					t.Fatalf("%s turn %d does not extend turn %d plus its reply", s.ID, i, i-1)
				}
				if msgs[len(msgs)-1].Role != "user" || !strings.HasPrefix(msgs[len(msgs)-1].Content, "Result of ") {
					t.Fatalf("%s turn %d ends with %+v, want a tool result", s.ID, i, msgs[len(msgs)-1].Role)
				}
			}
			prev = msgs
			conv.reply(fmt.Sprintf("reply %s %d", s.ID, i), nil)
		}
	}
}

func TestAgentToolResultSizesFollowTheDistribution(t *testing.T) {
	c := smallAgent(5)
	c.ToolResult = Dist{Kind: "fixed", A: 37}
	w, _ := Agent(c)
	for _, s := range w.Sessions {
		for _, turn := range s.Turns[1:] {
			body := turn.Append[0].Content
			_, words, _ := strings.Cut(body, "\n")
			if n := len(strings.Fields(words)); n != 37 {
				t.Fatalf("tool result of %d words, want 37", n)
			}
			if turn.Think < 0 || turn.Think > 2*c.Think {
				t.Fatalf("think time %v outside [0, %v]", turn.Think, 2*c.Think)
			}
		}
	}
}

func TestParseDist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Dist
		bad  bool
	}{
		{in: "fixed:300", want: Dist{Kind: "fixed", A: 300}},
		{in: "uniform:100,800", want: Dist{Kind: "uniform", A: 100, B: 800}},
		{in: "lognormal:400,0.8", want: Dist{Kind: "lognormal", A: 400, B: 0.8}},
		{in: "uniform:800,100", bad: true},
		{in: "fixed:0", bad: true},
		{in: "normal:3,4", bad: true},
		{in: "lognormal:400", bad: true},
		{in: "fixed:x", bad: true},
	} {
		got, err := ParseDist(tc.in)
		if tc.bad != (err != nil) || !tc.bad && got != tc.want {
			t.Errorf("ParseDist(%q) = %+v, %v", tc.in, got, err)
		}
		if !tc.bad && got.String() != tc.in {
			t.Errorf("String() = %q, want %q", got.String(), tc.in)
		}
	}
}
