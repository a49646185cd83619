package cli

import (
	"slices"
	"testing"
)

// The command tree is built in one place, newRootCommand; a subcommand missing from it, or one
// added twice, shows here.
func TestRootHasExactlyTheSubcommands(t *testing.T) {
	var got []string
	for _, c := range newRootCommand().Commands() {
		got = append(got, c.Name())
	}
	slices.Sort(got)
	if want := []string{"bench", "demo", "sim"}; !slices.Equal(got, want) {
		t.Errorf("subcommands %q, want %q", got, want)
	}
}
