package residency

import (
	"encoding/binary"
	"errors"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// ChangeKind names what a Change did.
type ChangeKind uint8

// The changes a tracker hands out: one per call of Started, Ended, Evicted and Forget.
const (
	ChangeStarted ChangeKind = iota + 1
	ChangeEnded
	ChangeEvicted
	ChangeForgotten
)

// MaxChangeString bounds a Change's key and worker name, in bytes: a change naming a longer one is
// neither written nor read.
const MaxChangeString = 4096

// Change is one change a tracker made to its model, for the trackers of the router's other
// replicas to make too (Apply): without them, each replica would count only the sessions it
// placed itself and take every worker for emptier than it is.
type Change struct {
	Kind   ChangeKind
	Key    string
	Worker tenant.ID // ChangeStarted: where the turn was placed
	Prompt int       // ChangeStarted, ChangeEnded: the turn's prompt tokens
	Output int       // ChangeEnded: its output tokens
	OK     bool      // ChangeEnded: the worker reported the tokens
}

var errBadChange = errors.New("residency: malformed change")

// Append appends c's encoding to b; it appends nothing when a string is over MaxChangeString.
func (c Change) Append(b []byte) []byte {
	if len(c.Key) > MaxChangeString || len(c.Worker) > MaxChangeString {
		return b
	}
	ok := byte(0)
	if c.OK {
		ok = 1
	}
	b = append(b, byte(c.Kind), ok)
	b = binary.AppendUvarint(b, uint64(max(c.Prompt, 0)))
	b = binary.AppendUvarint(b, uint64(max(c.Output, 0)))
	b = binary.AppendUvarint(b, uint64(len(c.Key)))
	b = append(b, c.Key...)
	b = binary.AppendUvarint(b, uint64(len(c.Worker)))
	return append(b, c.Worker...)
}

// ReadChange decodes the change at the start of b and returns the bytes after it. It allocates
// nothing for a malformed change: every length is checked against what b holds first.
func ReadChange(b []byte) (Change, []byte, error) {
	if len(b) < 2 || b[0] < byte(ChangeStarted) || b[0] > byte(ChangeForgotten) || b[1] > 1 {
		return Change{}, nil, errBadChange
	}
	c := Change{Kind: ChangeKind(b[0]), OK: b[1] == 1}
	b = b[2:]
	var nums [2]uint64
	for i := range nums {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<40 {
			return Change{}, nil, errBadChange
		}
		nums[i], b = v, b[n:]
	}
	c.Prompt, c.Output = int(nums[0]), int(nums[1])
	var strs [2]string
	for i := range strs {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > MaxChangeString || l > uint64(len(b)-n) {
			return Change{}, nil, errBadChange
		}
		strs[i], b = string(b[n:n+int(l)]), b[n+int(l):]
	}
	c.Key, c.Worker = strs[0], tenant.ID(strs[1])
	if c.Key == "" || (c.Kind == ChangeStarted && c.Worker == "") {
		return Change{}, nil, errBadChange
	}
	return c, b, nil
}

// Apply makes a change another replica's tracker made. It is not handed out again.
func (t *Tracker) Apply(c Change) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch c.Kind {
	case ChangeStarted:
		t.started(c.Key, c.Worker, c.Prompt)
		t.sessions[c.Key].remote++
	case ChangeEnded:
		if s := t.sessions[c.Key]; s != nil && s.remote > 0 {
			s.remote--
			t.ended(c.Key, c.Prompt, c.Output, c.OK)
		}
	case ChangeEvicted:
		t.evicted(c.Key)
	case ChangeForgotten:
		t.forget(c.Key)
	}
}

// record makes c, a change of this replica's own, and publishes it (see publish).
func (t *Tracker) record(c Change) {
	t.mu.Lock()
	switch c.Kind {
	case ChangeStarted:
		t.started(c.Key, c.Worker, c.Prompt)
	case ChangeEnded:
		t.ended(c.Key, c.Prompt, c.Output, c.OK)
	case ChangeEvicted:
		t.evicted(c.Key)
	case ChangeForgotten:
		t.forget(c.Key)
	}
	t.mu.Unlock()
	t.publish(c)
}

// publish hands c to Options.OnChange, outside the tracker's lock.
func (t *Tracker) publish(c Change) {
	if t.opts.OnChange != nil {
		t.opts.OnChange(c)
	}
}
