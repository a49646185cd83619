package router

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// The SDK tests drive a real router on loopback, in front of sdkWorkers simulated workers, with
// the official OpenAI and Anthropic Go SDKs as clients. Each test runs sdkSessions agent sessions
// of sdkTurns turns each, interleaved turn by turn, so that a session's next turn never simply
// follows the request before it.
const (
	sdkWorkers  = 4
	sdkSessions = 3
	sdkTurns    = 8
	sdkModel    = "sim-model"
	// sdkMaxTokens leaves room for the simulator's tool-call replies, which are whole or not at all.
	sdkMaxTokens = 64
	// sdkTimeout bounds each SDK request; the simulators do not sleep, so it is far from reach.
	sdkTimeout = 30 * time.Second
)

// sdkRig is a router with one policy in front of a fleet of simulators, and the HTTP client the
// SDKs share.
type sdkRig struct {
	tr     *testRouter
	fleet  *sim.Fleet
	block  int64
	client *http.Client
}

func startSDKRig(t *testing.T, policy string) *sdkRig {
	t.Helper()
	simCfg := instantSim()
	// The strict tool loop (a call to each user message, text after each result), so that the
	// SDKs' tool loops run every turn; the default rule calls about one turn in two.
	simCfg.ToolCallRate, simCfg.ToolCallDecay, simCfg.ToolPick = 1, 0, sim.ToolPickAny
	fleet, err := sim.StartLocal(sdkWorkers, simCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close) // after the router has stopped: cleanups run last first
	cfg := testConfig()
	cfg.Policy = policy
	tr := startRouter(t, cfg)
	for _, u := range fleet.URLs() {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	// No environment proxy: the router is on loopback and must be reached directly.
	transport := &http.Transport{
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	t.Cleanup(transport.CloseIdleConnections)
	return &sdkRig{tr: tr, fleet: fleet, block: int64(simCfg.BlockSize), client: &http.Client{Transport: transport}}
}

// openAI is an OpenAI client of the rig's router over the rig's HTTP client.
func (r *sdkRig) openAI() openai.Client { return openAIClient(r.tr.url, r.client) }

// anthropic is an Anthropic client of the rig's router over the rig's HTTP client.
func (r *sdkRig) anthropic() anthropic.Client { return anthropicClient(r.tr.url, r.client) }

// openAIClient is an OpenAI client whose base URL is the /v1 of the router at base, sending
// through hc, each request bounded by sdkTimeout. Retries are off, so that every answer the
// router gives reaches the test.
func openAIClient(base string, hc *http.Client) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(base+"/v1"),
		option.WithAPIKey("sk-test"),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(sdkTimeout),
	)
}

// anthropicClient is an Anthropic client whose base URL is the router at base itself (the SDK
// adds /v1/messages), sending through hc, each request bounded by sdkTimeout. Retries are off,
// and it reads nothing from the environment.
func anthropicClient(base string, hc *http.Client) anthropic.Client {
	return anthropic.NewClient(
		anthropicoption.WithoutEnvironmentDefaults(),
		anthropicoption.WithBaseURL(base),
		anthropicoption.WithAPIKey("sk-ant-test"),
		anthropicoption.WithHTTPClient(hc),
		anthropicoption.WithMaxRetries(0),
		anthropicoption.WithRequestTimeout(sdkTimeout),
	)
}

// sdkTurn is what one turn of a session showed: where the router sent it, why, and what the
// worker's prefix cache held of its prompt.
type sdkTurn struct {
	worker, decision string
	prompt, cached   int64
}

func (tn sdkTurn) String() string {
	return fmt.Sprintf("%s on %s, %d of %d prompt tokens cached", tn.decision, tn.worker, tn.cached, tn.prompt)
}

// routed reads the router's headers from the raw answer an SDK handed over, and checks that the
// worker the router names is the simulator that answered.
func (r *sdkRig) routed(t *testing.T, what string, resp *http.Response) sdkTurn {
	t.Helper()
	if resp == nil {
		t.Fatalf("%s: the SDK handed over no HTTP response", what)
	}
	tn := sdkTurn{worker: resp.Header.Get(proxy.HeaderWorker), decision: resp.Header.Get(proxy.HeaderDecision)}
	if !slices.Contains(r.fleet.URLs(), tn.worker) {
		t.Fatalf("%s: %s = %q, not one of the workers %v", what, proxy.HeaderWorker, tn.worker, r.fleet.URLs())
	}
	if got := "http://" + resp.Header.Get(sim.HeaderWorker); got != tn.worker {
		t.Fatalf("%s: the router names %s, but %s answered", what, tn.worker, got)
	}
	return tn
}

// checkSessionKeptItsCache asserts that every turn of a session was served by the worker of its
// first turn, that every later turn was placed by the decision want, and that the worker's
// prefix cache served more of each turn than of the turn before, at least the whole blocks of the
// previous turn's prompt.
func (r *sdkRig) checkSessionKeptItsCache(t *testing.T, session string, turns []sdkTurn, want string) {
	t.Helper()
	if len(turns) < 6 {
		t.Fatalf("%s: %d turns, want at least 6", session, len(turns))
	}
	home := turns[0].worker
	failed := false
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		failed = true
	}
	for i, tn := range turns[1:] {
		n := i + 2
		prev := turns[i]
		if tn.worker != home || tn.decision != want {
			fail("%s turn %d: %v; want %s on %s, the worker of turn 1", session, n, tn, want, home)
		}
		if tn.cached <= prev.cached {
			fail("%s turn %d: %d cached tokens, no more than turn %d's %d", session, n, tn.cached, n-1, prev.cached)
		}
		if whole := prev.prompt / r.block * r.block; tn.cached < whole {
			fail("%s turn %d: %d cached tokens; turn %d's prompt was %d tokens (%d in whole blocks)",
				session, n, tn.cached, n-1, prev.prompt, whole)
		}
	}
	if failed {
		for i, tn := range turns {
			t.Logf("%s turn %d: %v", session, i+1, tn)
		}
	}
}

// The tools every session offers, and the one rule the tests check tool calls against: a call
// names one of these tools and its arguments are a JSON object with the tool's required
// parameters.
type sdkTool struct {
	name, description string
	properties        map[string]any
	required          []string
}

var sdkTools = []sdkTool{
	{"read_file", "Read a file of the repository and return its text.",
		map[string]any{"path": map[string]any{"type": "string", "description": "path from the repository root"}},
		[]string{"path"}},
	{"run_tests", "Run the tests of one package and return their output.",
		map[string]any{
			"package": map[string]any{"type": "string"},
			"verbose": map[string]any{"type": "boolean"},
		},
		[]string{"package"}},
}

func sdkSchema(i int) map[string]any {
	return map[string]any{"type": "object", "properties": sdkTools[i].properties, "required": sdkTools[i].required}
}

// checkToolCall reports what is wrong with a call of name with arguments args, or "".
func checkToolCall(name, args string) string {
	i := slices.IndexFunc(sdkTools, func(tl sdkTool) bool { return tl.name == name })
	if i < 0 {
		return fmt.Sprintf("call of %q, which is not an offered tool", name)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal([]byte(args), &got); err != nil {
		return fmt.Sprintf("call of %s with arguments %q: %v", name, args, err)
	}
	for _, p := range sdkTools[i].required {
		if _, ok := got[p]; !ok {
			return fmt.Sprintf("call of %s with arguments %s lacks the required %q", name, args, p)
		}
	}
	return ""
}

// The agent's words. Each message is long enough (well over a KV block) that every turn adds
// whole blocks to the conversation.
const sdkSystem = "You are a coding agent working in a large Go repository. Read before you edit, " +
	"run the tests of every package you touch, and report what you changed in a few plain sentences. "

func sdkTask(session int) string {
	return fmt.Sprintf("Session %d: the router drops the session header when the body is larger than "+
		"one mebibyte; find where the body is read, fix it, and keep every existing test green.", session)
}

func sdkFollowUp(session, turn int) string {
	return fmt.Sprintf("Session %d, turn %d: good. Now look at the next place where a large body is read "+
		"and check that its limit is applied once, then run the tests of that package again.", session, turn)
}

func sdkToolResult(session, turn int, name string) string {
	return fmt.Sprintf("Session %d, turn %d, output of %s: %s", session, turn, name,
		strings.Repeat("ok  \tgithub.com/cacheroute/cacheroute/internal/proxy\t0.412s\n", 3))
}
