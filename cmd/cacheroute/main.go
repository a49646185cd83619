// Command cacheroute is a cache-aware router for OpenAI-compatible LLM inference workers.
package main

import (
	"os"

	"github.com/cacheroute/cacheroute/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}
