// Package cli builds the cacheroute command tree: the router (root command) and its subcommands.
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/router"
)

// Main runs the command line and returns the process exit code. It first runs the program again
// with the runtime's system monitor kept out of deep sleep (keepSysmonAwake), once.
func Main(args []string) int {
	keepSysmonAwake()
	if err := Execute(context.Background(), args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "cacheroute:", err)
		return 1
	}
	return 0
}

// spaceSeparatedFlags take their values as separate arguments after the flag.
var spaceSeparatedFlags = config.SpaceSeparatedFlags()

// Execute runs the command line args (without the program's name) with ctx, writing to stdout
// and stderr: the router until ctx ends or a signal stops it, or a subcommand.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCommand()
	root.SetOut(stdout)
	root.SetErr(stderr)
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
	}
	if err := checkEqualsForm(args, names); err != nil {
		return err
	}
	for _, flag := range spaceSeparatedFlags {
		args = config.ExpandSpaceSeparated(args, flag, names...)
	}
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// checkEqualsForm refuses `--worker-urls=a b`: with "=" the flag has its one value, and b would be
// taken for a subcommand ("unknown command"), which says nothing of the mistake.
func checkEqualsForm(args, subcommands []string) error {
	for i, a := range args {
		if a == "--" {
			return nil
		}
		for _, flag := range spaceSeparatedFlags {
			value, ok := strings.CutPrefix(a, "--"+flag+"=")
			if !ok || i+1 >= len(args) {
				continue
			}
			next := args[i+1]
			if strings.HasPrefix(next, "-") || slices.Contains(subcommands, next) {
				continue
			}
			return fmt.Errorf("--%s=%s %s: with '=' the flag takes a single value, so %q is not one of them; "+
				"give the values space-separated after the flag (--%s %s %s) or comma-separated (--%s=%s,%s)",
				flag, value, next, next, flag, value, next, flag, value, next)
		}
	}
	return nil
}

func newRootCommand() *cobra.Command {
	cfg := config.Default()
	var configFile string
	cmd := &cobra.Command{
		Use:   "cacheroute",
		Short: "A cache-aware router for OpenAI-compatible LLM inference workers",
		Long: `cacheroute routes OpenAI-compatible requests (/v1/chat/completions, /v1/completions, ...)
across vLLM-style workers, sending each request where its prompt prefix is most likely cached
without letting any worker drown.

Run without a subcommand it is the router. Every flag can also be set in a YAML file given with
--config, using the flag name in snake_case as the key; flags on the command line win.

The vLLM router's command lines work as they are: its flags that do something here do the
same, and the others are accepted with a warning at start that says what cacheroute does
instead (docs/migrating-from-vllm-router.md lists them all).`,
		Example: `  cacheroute --worker-urls http://127.0.0.1:8000 http://127.0.0.1:8001
  cacheroute --config router.yaml --port 8080
  cacheroute --allow-empty        # workers added later: POST /workers {"url": "http://..."}`,
		Args: func(cmd *cobra.Command, args []string) error {
			if versionAsked(cmd) {
				return nil // --version prints the version whatever else the line holds
			}
			return noArguments(cmd, args)
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if versionAsked(cmd) {
				return printVersion(cmd)
			}
			final, err := config.Load(cmd.Flags(), &cfg, configFile)
			if err != nil {
				return err
			}
			if err := final.RequireWorkerSource(); err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), final.LogLevel, final.LogFormat)
			for _, f := range config.IgnoredFlags(cmd.Flags(), cfg) {
				log.Warn("a vLLM router flag with no effect here", "flag", f.Flag, "value", f.Value, "instead", f.Instead)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return router.Run(ctx, final, log)
		},
	}
	cmd.SetContext(context.Background())
	config.BindFlags(cmd.Flags(), &cfg)
	config.BindVLLMRouterFlags(cmd.Flags())
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with the same keys as the flags (snake_case); flags override it")
	// -V as the vLLM router spells it. The command prints the version itself rather than through
	// cobra's Version field: cobra formats anything but "NAME version X" with text/template, whose
	// calls of methods by name make the linker keep every exported method of every type in the
	// binary (about a third of its size).
	cmd.Flags().BoolP("version", "V", false, "print the version (module, source revision, Go) and exit")
	cmd.Flags().SortFlags = false
	cmd.SetFlagErrorFunc(suggestFlag)
	cmd.SuggestionsMinimumDistance = 2 // cobra's own default, which SuggestionsFor does not apply
	cmd.AddCommand(
		newSimCommand(),
		newBenchCommand(),
		newDemoCommand(),
		newVersionCommand(),
	)
	return cmd
}

// noArguments refuses positional arguments with a message that names the subcommands, where
// cobra would say `unknown command "x"` for a stray value.
func noArguments(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	err := fmt.Errorf("unexpected argument %q: the router takes flags only (see --help), and the subcommands are %s",
		args[0], strings.Join(names, ", "))
	if near := cmd.SuggestionsFor(args[0]); len(near) > 0 {
		err = fmt.Errorf("%w\n\nDid you mean this?\n\t%s", err, strings.Join(near, "\n\t"))
	}
	return err
}

// newLogger returns a log/slog logger at level in text or json format.
func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
