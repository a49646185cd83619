package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// newVersionCommand returns `cacheroute version`, which prints what `cacheroute --version` does.
func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:           "version",
		Short:         "Print the version: module version, source revision and Go version",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version())
			return err
		},
	}
}

// version describes this binary from the build information the Go toolchain embeds in it.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return formatVersion(info)
}

// formatVersion is three lines at most: the module version ("(devel)" for a build from a working
// tree), the source revision with its commit time and whether the tree had uncommitted changes
// (when the build recorded them: `go build` in a git checkout does, `go run` and `go test` do not),
// and the Go version and platform.
//
//	cacheroute v0.4.0
//	revision 0217f5d1c2e4b6a8d0f1e3c5a7b9d1f3e5a7c9b1 (2026-12-01T05:34:14Z, modified)
//	go1.26.8 linux/amd64
func formatVersion(info *debug.BuildInfo) string {
	mod, goVersion := "unknown", runtime.Version()
	var revision, when string
	var modified bool
	if info != nil {
		if v := info.Main.Version; v != "" {
			mod = v
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	lines := []string{"cacheroute " + mod}
	if revision != "" {
		var notes []string
		if when != "" {
			notes = append(notes, when)
		}
		if modified {
			notes = append(notes, "modified")
		}
		line := "revision " + revision
		if len(notes) > 0 {
			line += " (" + strings.Join(notes, ", ") + ")"
		}
		lines = append(lines, line)
	}
	lines = append(lines, goVersion+" "+runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(lines, "\n")
}
