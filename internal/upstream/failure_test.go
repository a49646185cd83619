package upstream

import (
	"slices"
	"testing"
)

// Every kind a failure can have has its upstream_errors_total series from the start: none is
// missing from Kinds.
func TestKindsListsEveryKind(t *testing.T) {
	for _, kind := range []string{KindConnect, KindReset, KindFirstByte, KindTimeout, KindStatus, KindSent, KindMidStream, KindBadReply, KindStalled} {
		if !slices.Contains(Kinds, kind) {
			t.Errorf("kind %q is not in Kinds", kind)
		}
	}
}
