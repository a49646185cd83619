package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// suggestFlag is every command's flag error handler: an unknown flag is answered with the
// command's flags that are spelled closest to it, as cobra answers an unknown subcommand.
func suggestFlag(cmd *cobra.Command, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return err
	}
	if near := nearFlags(cmd.Flags(), name); len(near) > 0 {
		return fmt.Errorf("%w\n\nDid you mean this?\n\t--%s", err, strings.Join(near, "\n\t--"))
	}
	return err
}

// maxSuggestions bounds the flags one suggestion names.
const maxSuggestions = 3

// nearFlags returns the visible flags of fs whose name is at most two edits from name, or that
// begin or end with it (--workers for --worker-urls), closest first.
func nearFlags(fs *pflag.FlagSet, name string) []string {
	type near struct {
		name string
		d    int
	}
	var found []near
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if d <= 2 || (len(name) >= 4 && (strings.HasPrefix(f.Name, name) || strings.HasSuffix(f.Name, name))) {
			found = append(found, near{f.Name, d})
		}
	})
	slices.SortStableFunc(found, func(a, b near) int { return a.d - b.d })
	var out []string
	for _, f := range found[:min(len(found), maxSuggestions)] {
		out = append(out, f.name)
	}
	return out
}

// editDistance is the Levenshtein distance of a and b, in bytes (flag names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
