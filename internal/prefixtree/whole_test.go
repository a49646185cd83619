package prefixtree

import (
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

func TestWholeIsTheLongestInsertedKeyThatPrefixesTheQuery(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|tools|task-1.", "a")
	tr.Insert(model, "sys|tools|task-1.reply.more.", "b")
	tr.Insert(model, "sys|tools|task-2.", "c")

	m := tr.Match(model, "sys|tools|task-1.reply.more.next.")
	if m.Whole != len("sys|tools|task-1.reply.more.") || !slices.Equal(m.WholeHolders, []tenant.ID{"b"}) {
		t.Fatalf("continuation of b's key: whole %d by %v", m.Whole, m.WholeHolders)
	}
	m = tr.Match(model, "sys|tools|task-1.reply.other.")
	if m.Whole != len("sys|tools|task-1.") || !slices.Equal(m.WholeHolders, []tenant.ID{"a", "b"}) {
		t.Fatalf("fork after a's key: whole %d by %v", m.Whole, m.WholeHolders)
	}
	if m.Matched != len("sys|tools|task-1.reply.") || !slices.Equal(m.Holders, []tenant.ID{"b"}) {
		t.Fatalf("fork after a's key: matched %d by %v", m.Matched, m.Holders)
	}
}

func TestSharedTrunkAloneIsNoWholeMatch(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|tools|task-1.", "a")
	tr.Insert(model, "sys|tools|task-2.", "b")
	m := tr.Match(model, "sys|tools|task-3.")
	if m.Matched != len("sys|tools|task-") || m.Whole != 0 || m.WholeHolders != nil {
		t.Fatalf("new conversation on a shared trunk: matched %d, whole %d by %v", m.Matched, m.Whole, m.WholeHolders)
	}
}

func TestKeyEndingInsideAnEdgeMarksTheSplit(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "abcdef", "a")
	if m := tr.Match(model, "abcq"); m.Whole != 0 {
		t.Fatalf("no key ends at abc yet: whole %d", m.Whole)
	}
	tr.Insert(model, "abc", "b")
	m := tr.Match(model, "abcq")
	if m.Whole != 3 || !slices.Equal(m.WholeHolders, []tenant.ID{"a", "b"}) {
		t.Fatalf("after inserting abc: whole %d by %v", m.Whole, m.WholeHolders)
	}
	if m := tr.Match(model, "abcdef"); m.Whole != 6 || !slices.Equal(m.WholeHolders, []tenant.ID{"a"}) {
		t.Fatalf("the same key again: whole %d by %v", m.Whole, m.WholeHolders)
	}
}

func TestWholeForgetsRemovedTenants(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "conv.", "a")
	tr.Insert(model, "conv.more.", "b")
	tr.RemoveTenant("a")
	m := tr.Match(model, "conv.next.")
	if m.Whole != len("conv.") || !slices.Equal(m.WholeHolders, []tenant.ID{"b"}) {
		t.Fatalf("after removing a: whole %d by %v", m.Whole, m.WholeHolders)
	}
	tr.RemoveTenant("b")
	if m := tr.Match(model, "conv.next."); m.Whole != 0 || m.Matched != 0 {
		t.Fatalf("empty tree: %+v", m)
	}
}

func TestBranchMarksWhereConversationsDiverge(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|task-1|block-a|block-b|", "a")
	// One conversation so far: nothing diverges on the path.
	if m := tr.Match(model, "sys|task-1|block-a|block-c|"); m.Branch != 0 || m.Matched != len("sys|task-1|block-a|block-") {
		t.Fatalf("inside one conversation: %+v", m)
	}
	tr.Insert(model, "sys|task-2|", "b")
	// A new conversation shares only what the two diverge after.
	if m := tr.Match(model, "sys|task-3|"); m.Branch != len("sys|task-") || m.Matched != len("sys|task-") {
		t.Fatalf("a prefix two conversations diverge from: %+v", m)
	}
	// A continuation of the first (its last block changed) matches far beyond the branch.
	m := tr.Match(model, "sys|task-1|block-a|block-x|block-y|")
	if m.Branch != len("sys|task-") || m.Matched != len("sys|task-1|block-a|block-") {
		t.Fatalf("a continuation past the branch: %+v", m)
	}
}
