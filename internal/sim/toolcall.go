package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// The tool-call rule of the Responses and Messages APIs, and of the chat API
// when the request sets tool_choice. It is deterministic (every draw is
// seeded by the worker seed and the prompt), so that an SDK's tool loop runs
// the same way every time; it lets a conversation end, and by default it
// calls only tools that change nothing, because an agent harness really runs
// the calls it gets:
//
//   - no call when the request offers no function tool, its tool choice
//     forbids calls ("none"), or the conversation is empty;
//   - a tool choice that forces a call (a named tool, "required" in the
//     OpenAI APIs, "any" in the Messages API) gets one on every reply, as
//     vLLM's guided decoding gives it;
//   - otherwise ("auto", or no tool choice) the reply calls a tool with the
//     chance Config.ToolCallRate × Config.ToolCallDecay^k, where k is the
//     number of assistant messages with tool calls since the user's last
//     message. A user message that only carries tool results (the Messages
//     API's tool_result blocks, with or without text beside them) is not the
//     user's message. With the default decay of 0.5 a run of calls ends after
//     about two rounds; with 0 a reply to a tool result is always text;
//   - the tool called is the one the tool choice names, if it names one.
//     Else, with Config.ToolPick ToolPickReadOnly (the default), tool
//     k' mod n of the n offered tools that only read (readOnlyTool), where k'
//     is the number of tool calls already in the conversation; when none is
//     offered the reply is text, or, when the tool choice forces a call, the
//     pick falls to all tools. With ToolPickAny it is tool k' mod n of all
//     the tools;
//   - the arguments are a compact JSON object with the tool's required
//     parameters in sorted order: an enum's first value, else by type "" for
//     a string (a path or a command that names nothing), 1 for a number or
//     integer, true for a boolean, [] for an array, {} for an object, null
//     for anything else;
//   - the reply is generated as the tokens the chat template renders for
//     that call (<|tool_call|>name {args}), so it is cached as exactly what
//     the next turn renders for the assistant's call. When those tokens do
//     not fit in the request's max tokens, the reply is text instead.
//
// The chat API applies the rule only to a request that sets tool_choice
// (any value but null; "none" still means text). A chat request that offers
// tools without it gets text, as it always has: workloads such as the
// bench's chat agent send tools every turn and expect text replies. A chat
// call is answered in tool_calls with content null, streamed as tool_calls
// deltas (id, type and name first, then the arguments token by token), and
// finishes as vLLM's and OpenAI's do: "tool_calls", or "stop" when the tool
// choice named the tool.

// Values of Config.ToolPick.
const (
	ToolPickReadOnly = "read-only" // only tools that read (readOnlyTool)
	ToolPickAny      = "any"       // every offered tool in turn
)

// toolSpec is one function a request offers.
type toolSpec struct {
	Name       string
	Parameters json.RawMessage
}

// toolChoice is a request's tool choice, reduced to what the rule reads.
type toolChoice struct {
	none     bool   // calls are forbidden
	required bool   // a call is forced, the rule picks the tool
	name     string // the tool to call, or "" for the rule's pick
}

// plannedCall is a reply that calls a tool.
type plannedCall struct {
	call   prompt.ToolCall
	script []string // the reply's tokens
	// argsAt is the byte offset of the arguments in the concatenated
	// script, so a stream can send the arguments alone.
	argsAt int
	// named reports that the tool choice named the tool called.
	named bool
}

// readOnlyPrefixes are the name starts of tools taken to only read: the
// harnesses' file readers and searches (Claude Code's Read, Glob, Grep,
// ListAgents; Codex's view_image, get_goal) and the usual get_/list_ tools.
var readOnlyPrefixes = []string{"read", "get", "list", "view", "glob", "grep", "search", "find"}

// actingWords, anywhere in a tool's name, say that it may change something
// (search_replace, get_and_delete, list_and_run …): such a tool is never
// taken to only read, whatever its name starts with.
var actingWords = []string{"write", "edit", "replace", "delete", "remove", "create", "update", "set",
	"exec", "run", "kill", "patch", "move", "send", "post", "put", "spawn", "install"}

// readOnlyTool reports whether a tool's name says that it only reads:
// "ls", or a name that starts with one of readOnlyPrefixes and holds none of
// actingWords, in any case.
func readOnlyTool(name string) bool {
	name = strings.ToLower(name)
	if name == "ls" {
		return true
	}
	for _, w := range actingWords {
		if strings.Contains(name, w) {
			return false
		}
	}
	for _, p := range readOnlyPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// lastUserMessage returns the index of the last message of role "user", or
// -1: in the chat and Responses APIs a tool result is a message of its own.
func lastUserMessage(msgs []prompt.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "user" {
			return i
		}
	}
	return -1
}

// planToolCall applies the rule to a rendered turn whose user spoke last in
// msgs[lastUser] (-1: never); nil means a text reply.
func (w *Worker) planToolCall(seq *prompt.Sequence, msgs []prompt.Message, lastUser int, tools []toolSpec, choice toolChoice, maxTokens int) *plannedCall {
	if len(tools) == 0 || choice.none || len(msgs) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(w.cfg.Seed), kvcache.HashBytes(seq.Text)^0x7001ca11))
	forced := choice.required || choice.name != ""
	if !forced {
		rounds := 0
		for i := lastUser + 1; i < len(msgs); i++ {
			if len(msgs[i].ToolCalls) > 0 {
				rounds++
			}
		}
		chance := w.cfg.ToolCallRate * math.Pow(w.cfg.ToolCallDecay, float64(rounds))
		if rng.Float64() >= chance {
			return nil
		}
	}
	tool := -1
	if choice.name != "" {
		tool = slices.IndexFunc(tools, func(t toolSpec) bool { return t.Name == choice.name })
	}
	named := tool >= 0
	if !named {
		calls := 0
		for i := range msgs {
			calls += len(msgs[i].ToolCalls)
		}
		pool := tools
		if w.cfg.ToolPick == ToolPickReadOnly {
			var ro []toolSpec
			for _, t := range tools {
				if readOnlyTool(t.Name) {
					ro = append(ro, t)
				}
			}
			switch {
			case len(ro) > 0:
				pool = ro
			case !forced:
				return nil
			}
		}
		tools, tool = pool, calls%len(pool)
	}
	tc := prompt.ToolCall{Name: tools[tool].Name, Arguments: toolArguments(tools[tool].Parameters)}
	text := string(prompt.AppendToolCall(nil, tc))
	script := prompt.Tokenize(text)
	if len(script) > maxTokens {
		return nil
	}
	return &plannedCall{call: tc, script: script, argsAt: len(text) - len(tc.Arguments), named: named}
}

// argsPart returns the part of tok, which starts at byte offset at of the
// script, that lies within the arguments.
func (p *plannedCall) argsPart(tok string, at int) string {
	if skip := p.argsAt - at; skip > 0 {
		if skip >= len(tok) {
			return ""
		}
		return tok[skip:]
	}
	return tok
}

// toolArguments builds the arguments of a call from the tool's JSON schema.
func toolArguments(params json.RawMessage) string {
	type property struct {
		Type json.RawMessage   `json:"type"`
		Enum []json.RawMessage `json:"enum"`
	}
	var schema struct {
		Properties map[string]property `json:"properties"`
		Required   []string            `json:"required"`
	}
	_ = json.Unmarshal(params, &schema) // a schema the rule cannot read gives {}
	names := slices.Clone(schema.Required)
	slices.Sort(names)
	names = slices.Compact(names)
	// Written as Python's json.dumps writes an object (", ", ": "): vLLM's
	// Messages serving writes a tool_use input back so, and a model whose
	// calls look alike finds its own call in its cache on the next turn.
	b := []byte{'{'}
	for i, name := range names {
		if i > 0 {
			b = append(b, ", "...)
		}
		key, _ := protocol.PythonJSON(appendJSONString(nil, name))
		b = append(b, key...)
		b = append(b, ": "...)
		b = appendArgumentValue(b, schema.Properties[name].Type, schema.Properties[name].Enum)
	}
	return string(append(b, '}'))
}

func appendArgumentValue(b []byte, typ json.RawMessage, enum []json.RawMessage) []byte {
	if len(enum) > 0 {
		if v, err := protocol.PythonJSON(enum[0]); err == nil {
			return append(b, v...)
		}
	}
	// "type" is a name or a list of names; the first that is not "null" wins.
	var names []string
	var one string
	if json.Unmarshal(typ, &one) == nil {
		names = []string{one}
	} else {
		_ = json.Unmarshal(typ, &names)
	}
	for _, t := range names {
		switch t {
		case "string":
			return append(b, `""`...)
		case "integer", "number":
			return append(b, '1')
		case "boolean":
			return append(b, "true"...)
		case "array":
			return append(b, "[]"...)
		case "object":
			return append(b, "{}"...)
		}
	}
	return append(b, "null"...)
}

// flatTool is a function tool as the Responses and Messages APIs give it:
// flat, its schema under parameters (Responses) or input_schema (Messages).
type flatTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description"` // nil: absent, as vLLM tells it from ""
	Parameters  json.RawMessage `json:"parameters"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// convertFlatTools converts the flat tools whose type accept lets through to chat
// tools (protocol.ChatTool), the shape they render through the template in,
// so that a conversation renders the same whichever of the three APIs
// carries it; it returns them rendered (see renderTools) and their function
// specs for the tool-call rule. schema picks a tool's schema; a tool without
// a name is the error missing gives.
func convertFlatTools(tools []flatTool, accept func(typ string) bool, schema func(*flatTool) json.RawMessage, missing func(i int) error) ([]byte, []toolSpec, error) {
	var chat []protocol.ChatTool
	var specs []toolSpec
	for i := range tools {
		t := &tools[i]
		if !accept(t.Type) {
			continue
		}
		if t.Name == "" {
			return nil, nil, missing(i)
		}
		ct := protocol.ChatTool{Type: "function", Function: protocol.ChatFunction{Name: t.Name, Description: t.Description}}
		if p := bytes.TrimSpace(schema(t)); len(p) > 0 && string(p) != "null" {
			ct.Function.Parameters = p
		}
		chat = append(chat, ct)
		specs = append(specs, toolSpec{Name: t.Name, Parameters: ct.Function.Parameters})
	}
	return renderTools(chat), specs, nil
}

// renderTools returns tools as the compact chat-shaped JSON the template
// renders, or nil for none.
func renderTools(tools []protocol.ChatTool) []byte {
	if len(tools) == 0 {
		return nil
	}
	// Without HTML escaping, so that "<" in a description renders as the
	// chat API renders the same tools: as sent, compacted.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(tools) // the parameters are valid JSON, decoded already
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}
