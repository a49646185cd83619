// Package cli builds the cacheroute command tree: the router (root command) and its subcommands.
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/router"
)

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	root := newRootCommand()
	var names []string
	for _, c := range root.Commands() {
		names = append(names, c.Name())
	}
	root.SetArgs(config.ExpandSpaceSeparated(args, "worker-urls", names...))
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cacheroute:", err)
		return 1
	}
	return 0
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
--config, using the flag name in snake_case as the key; flags on the command line win.`,
		Example: `  cacheroute --worker-urls http://127.0.0.1:8000 http://127.0.0.1:8001
  cacheroute --config router.yaml --port 8080`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			final, err := config.Load(cmd.Flags(), &cfg, configFile)
			if err != nil {
				return err
			}
			log := newLogger(os.Stderr, final.LogLevel, final.LogFormat)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return router.Run(ctx, final, log)
		},
	}
	cmd.SetContext(context.Background())
	config.BindFlags(cmd.Flags(), &cfg)
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file with the same keys as the flags (snake_case); flags override it")
	cmd.Flags().SortFlags = false
	cmd.AddCommand(
		newSimCommand(),
		newBenchCommand(),
		newDemoCommand(),
	)
	return cmd
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
