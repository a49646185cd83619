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
			return printVersion(cmd)
		},
	}
}

// versionAsked reports whether cmd's command line holds --version (or -V).
func versionAsked(cmd *cobra.Command) bool {
	asked, err := cmd.Flags().GetBool("version")
	return err == nil && asked
}

// printVersion writes the version to cmd's output.
func printVersion(cmd *cobra.Command) error {
	_, err := fmt.Fprintln(cmd.OutOrStdout(), version())
	return err
}

// The source the binary was built from, as the linker records it with -X (`make build` and
// deploy/Dockerfile do) for builds the Go toolchain does not stamp: `go build` stamps vcs.revision
// only in a git clone whose .git is a directory (not in a git worktree, nor with
// -buildvcs=false), and `go run` only with -buildvcs=true. Reading .git when the binary runs
// would describe wherever it runs, not what it was built from, so it is never done.
var (
	sourceRevision string // the commit
	sourceTime     string // its commit time, RFC 3339 in UTC
	sourceModified string // "true" when the tree had changes not committed
)

// version describes this binary from the build information the Go toolchain embeds in it, or
// the revision the linker was given.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return formatVersion(info, linkerSource())
}

// linkerSource is the revision the linker was given, as the toolchain's vcs settings; nil when
// none was.
func linkerSource() []debug.BuildSetting {
	if sourceRevision == "" {
		return nil
	}
	return []debug.BuildSetting{{Key: "vcs.revision", Value: sourceRevision}, {Key: "vcs.time", Value: sourceTime},
		{Key: "vcs.modified", Value: sourceModified}}
}

// formatVersion is three lines: the module version ("(devel)" for a build from a working tree),
// the source revision with its commit time and whether the tree had uncommitted changes, and
// the Go version and platform. The revision is the toolchain's vcs settings in info, else
// fallback (the linker's); without either the line says the build recorded none.
//
//	cacheroute v0.4.0
//	revision 0217f5d1c2e4b6a8d0f1e3c5a7b9d1f3e5a7c9b1 (2026-12-01T05:34:14Z, modified)
//	go1.26.8 linux/amd64
func formatVersion(info *debug.BuildInfo, fallback []debug.BuildSetting) string {
	mod, goVersion := "unknown", runtime.Version()
	settings := fallback
	if info != nil {
		if v := info.Main.Version; v != "" {
			mod = v
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				settings = info.Settings
			}
		}
	}
	var revision, when string
	var modified bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	line := "revision unknown: this build recorded none (`make build` records it)"
	if revision != "" {
		var notes []string
		if when != "" {
			notes = append(notes, when)
		}
		if modified {
			notes = append(notes, "modified")
		}
		line = "revision " + revision
		if len(notes) > 0 {
			line += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return strings.Join([]string{"cacheroute " + mod, line, goVersion + " " + runtime.GOOS + "/" + runtime.GOARCH}, "\n")
}
