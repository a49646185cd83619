package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// AgentConfig shapes the agent workload: S sessions of T turns that share a system prompt and
// one of a few tool sets, each with its own task. Every size is in pseudo-tokens (about one BPE
// token per short word).
type AgentConfig struct {
	Sessions int
	Turns    int
	// SharedPrefixTokens is the size of the system prompt plus tool schemas: half goes to the
	// system prompt, half to the tool descriptions.
	SharedPrefixTokens int
	ToolSets           int  // tool-set variants; each session uses one
	TaskTokens         int  // the session's own first user message
	ToolResult         Dist // size of the tool result each later turn adds
	OutputTokens       int  // max_tokens of every request
	// Think is the mean pause before each later turn (the agent running its tool); each pause
	// is drawn uniformly from [0, 2×Think], which also keeps sessions from running in lockstep.
	Think time.Duration
	Seed  uint64
}

// DefaultAgentConfig is the agent workload of `cacheroute bench` when no flag changes it.
func DefaultAgentConfig() AgentConfig {
	return AgentConfig{
		Sessions:           32,
		Turns:              10,
		SharedPrefixTokens: 1500,
		ToolSets:           3,
		TaskTokens:         150,
		ToolResult:         Dist{Kind: "lognormal", A: 400, B: 0.8},
		OutputTokens:       64,
		Think:              500 * time.Millisecond,
		Seed:               1,
	}
}

// Validate reports the first setting out of range.
func (c AgentConfig) Validate() error {
	switch {
	case c.Sessions < 1:
		return fmt.Errorf("--sessions must be at least 1, got %d", c.Sessions)
	case c.Turns < 1:
		return fmt.Errorf("--turns must be at least 1, got %d", c.Turns)
	case c.SharedPrefixTokens < 0:
		return fmt.Errorf("--shared-prefix-tokens must not be negative")
	case c.ToolSets < 1:
		return fmt.Errorf("--tool-sets must be at least 1, got %d", c.ToolSets)
	case c.TaskTokens < 1:
		return fmt.Errorf("--task-tokens must be at least 1, got %d", c.TaskTokens)
	case c.OutputTokens < 1:
		return fmt.Errorf("--output-tokens must be at least 1, got %d", c.OutputTokens)
	case c.Think < 0:
		return fmt.Errorf("--think-time must not be negative")
	}
	return nil
}

// toolNames are the functions an agent's tool sets draw from.
var toolNames = []string{"read_file", "write_file", "list_dir", "grep", "run_tests", "run_shell",
	"git_diff", "git_commit", "search_docs", "http_get"}

// toolsPerSet is the number of tools in one tool set.
const toolsPerSet = 6

// Agent generates the agent workload. The same config always yields the same workload, and a
// session's content depends only on the seed and its index, not on the number of sessions.
func Agent(c AgentConfig) (Workload, error) {
	if err := c.Validate(); err != nil {
		return Workload{}, err
	}
	base := rand.New(rand.NewPCG(c.Seed, 0xa6e47))
	system := "You are a coding agent working in a large repository. Use the tools to inspect and change code; answer briefly." +
		wordText(base, max(0, c.SharedPrefixTokens/2-24))
	toolSets := make([]json.RawMessage, c.ToolSets)
	for v := range toolSets {
		toolSets[v] = toolSet(rand.New(rand.NewPCG(c.Seed, 0x7001+uint64(v))), c.SharedPrefixTokens-c.SharedPrefixTokens/2)
	}
	w := Workload{Name: "agent", Sessions: make([]Session, c.Sessions)}
	for s := range w.Sessions {
		rng := rand.New(rand.NewPCG(c.Seed, 0x5e55+uint64(s)))
		variant := rng.IntN(c.ToolSets)
		sess := Session{ID: fmt.Sprintf("agent-%d-%d", c.Seed, s), Tools: toolSets[variant], Turns: make([]Turn, c.Turns)}
		task := fmt.Sprintf("Task %d: fix the failing build in module %d and keep the tests green.", s, rng.IntN(1000)) +
			wordText(rng, c.TaskTokens)
		sess.Turns[0] = Turn{Append: []Message{{Role: "system", Content: system}, {Role: "user", Content: task}}, MaxTokens: c.OutputTokens}
		for t := 1; t < c.Turns; t++ {
			tool := toolNames[rng.IntN(len(toolNames))]
			content := fmt.Sprintf("Result of %s (turn %d):\n", tool, t) + wordText(rng, c.ToolResult.Draw(rng))
			think := time.Duration(rng.Float64() * 2 * float64(c.Think))
			sess.Turns[t] = Turn{Append: []Message{{Role: "user", Content: content}}, MaxTokens: c.OutputTokens, Think: think}
		}
		w.Sessions[s] = sess
	}
	return w, nil
}

// toolSet returns a tools array of toolsPerSet functions whose descriptions hold about tokens
// words in all.
func toolSet(rng *rand.Rand, tokens int) json.RawMessage {
	names := append([]string(nil), toolNames...)
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	type fn struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
	}
	type tool struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	tools := make([]tool, toolsPerSet)
	for i := range tools {
		tools[i] = tool{Type: "function", Function: fn{
			Name:        names[i],
			Description: strings.TrimSpace(wordText(rng, max(1, tokens/toolsPerSet-20))),
			Parameters: map[string]any{"type": "object", "properties": map[string]any{
				"path": map[string]string{"type": "string"}}, "required": []string{"path"}},
		}}
	}
	b, _ := json.Marshal(tools)
	return b
}
