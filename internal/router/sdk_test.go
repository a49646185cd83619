package router

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// An agent on the OpenAI SDK's chat completions, streaming, with a tool loop: each session's id
// travels in the x-session-id header; every turn resends the whole conversation, tool calls and
// tool results included. Every turn of a session is served by one worker, whose prefix cache
// holds more of each turn than of the one before. The requests set tool_choice "auto": the
// simulator's chat API calls tools only when tool_choice is set.
func TestSDKChatStreamToolLoopStaysOnItsWorkersCache(t *testing.T) {
	rig := startSDKRig(t, "cache_aware")
	client := rig.openAI()
	var tools []openai.ChatCompletionToolUnionParam
	for i, tl := range sdkTools {
		tools = append(tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: tl.name, Description: openai.String(tl.description), Parameters: shared.FunctionParameters(sdkSchema(i)),
		}))
	}
	type session struct {
		id        string
		msgs      []openai.ChatCompletionMessageParamUnion
		turns     []sdkTurn
		toolTurns int
	}
	sessions := make([]*session, sdkSessions)
	for s := range sessions {
		sessions[s] = &session{id: fmt.Sprintf("chat-agent-%d", s),
			msgs: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sdkSystem), openai.UserMessage(sdkTask(s))}}
	}
	for turn := 1; turn <= sdkTurns; turn++ {
		for s, ss := range sessions {
			what := fmt.Sprintf("%s turn %d", ss.id, turn)
			var raw *http.Response
			stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
				Model: sdkModel, Messages: ss.msgs, Tools: tools, MaxTokens: openai.Int(sdkMaxTokens),
				ToolChoice:    openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			}, option.WithHeader("x-session-id", ss.id), option.WithResponseInto(&raw))
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				chunks++
				if !acc.AddChunk(stream.Current()) {
					t.Fatalf("%s: chunk %d does not accumulate: %s", what, chunks, stream.Current().RawJSON())
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("%s: stream: %v", what, err)
			}
			_ = stream.Close()
			tn := rig.routed(t, what, raw)
			if len(acc.Choices) != 1 || acc.Usage.PromptTokens == 0 {
				t.Fatalf("%s: %d chunks accumulated to %d choices, %d prompt tokens in the usage",
					what, chunks, len(acc.Choices), acc.Usage.PromptTokens)
			}
			tn.prompt, tn.cached = acc.Usage.PromptTokens, acc.Usage.PromptTokensDetails.CachedTokens
			ss.turns = append(ss.turns, tn)
			msg := acc.Choices[0].Message
			ss.msgs = append(ss.msgs, msg.ToParam())
			if len(msg.ToolCalls) == 0 {
				if acc.Choices[0].FinishReason == "tool_calls" {
					t.Fatalf("%s: finish_reason tool_calls without a tool call", what)
				}
				ss.msgs = append(ss.msgs, openai.UserMessage(sdkFollowUp(s, turn)))
				continue
			}
			if acc.Choices[0].FinishReason != "tool_calls" {
				t.Errorf("%s: %d tool calls with finish_reason %q", what, len(msg.ToolCalls), acc.Choices[0].FinishReason)
			}
			ss.toolTurns++
			for _, call := range msg.ToolCalls {
				if bad := checkToolCall(call.Function.Name, call.Function.Arguments); bad != "" || call.ID == "" {
					t.Fatalf("%s: %s (call id %q)", what, bad, call.ID)
				}
				ss.msgs = append(ss.msgs, openai.ToolMessage(sdkToolResult(s, turn, call.Function.Name), call.ID))
			}
		}
	}
	for _, ss := range sessions {
		if ss.toolTurns < 3 {
			t.Errorf("%s: the worker called a tool in %d of %d turns, want at least 3", ss.id, ss.toolTurns, sdkTurns)
		}
		rig.checkSessionKeptItsCache(t, ss.id, ss.turns, "session_id_match")
	}
}

// The shapes of a Responses agent session.
type responsesMode struct {
	// chained: every turn after the first sends only its new items, with previous_response_id
	// naming the last answer (stored, the default). Otherwise every turn sends the whole input
	// with the session in prompt_cache_key, and store false.
	chained bool
	stream  bool
}

// responsesSession is one agent's conversation over the Responses API.
type responsesSession struct {
	id       string
	prevID   string                                  // the last answer's id (chained)
	history  []responses.ResponseInputItemUnionParam // every item so far (whole input)
	next     []responses.ResponseInputItemUnionParam // this turn's new items
	turns    []sdkTurn
	calls    int
	notFound []string // the 404 answers, one per session at most: a chain cannot go on after one
}

// runResponsesSessions runs sdkSessions agent sessions of up to sdkTurns turns through rig with
// the OpenAI SDK's Responses API. Each session offers the tools; a function call is answered with
// its output, a text answer with the next instruction. A 404 ends its session and is recorded;
// any other failure ends the test.
func runResponsesSessions(t *testing.T, rig *sdkRig, mode responsesMode) []*responsesSession {
	t.Helper()
	client := rig.openAI()
	var tools []responses.ToolUnionParam
	for i, tl := range sdkTools {
		tools = append(tools, responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
			Name: tl.name, Description: openai.String(tl.description), Parameters: sdkSchema(i), Strict: openai.Bool(false),
		}})
	}
	sessions := make([]*responsesSession, sdkSessions)
	for s := range sessions {
		sessions[s] = &responsesSession{id: fmt.Sprintf("responses-agent-%d", s),
			next: []responses.ResponseInputItemUnionParam{responses.ResponseInputItemParamOfMessage(sdkTask(s), responses.EasyInputMessageRoleUser)}}
	}
	for turn := 1; turn <= sdkTurns; turn++ {
		for s, ss := range sessions {
			if len(ss.notFound) > 0 {
				continue
			}
			what := fmt.Sprintf("%s turn %d", ss.id, turn)
			params := responses.ResponseNewParams{
				Model: sdkModel, Instructions: openai.String(sdkSystem), Tools: tools,
				MaxOutputTokens: openai.Int(sdkMaxTokens),
			}
			if mode.chained {
				params.Input.OfInputItemList = ss.next
				if ss.prevID != "" {
					params.PreviousResponseID = openai.String(ss.prevID)
				}
			} else {
				ss.history = append(ss.history, ss.next...)
				params.Input.OfInputItemList = ss.history
				params.PromptCacheKey = openai.String(ss.id)
				params.Store = openai.Bool(false)
			}
			var raw *http.Response
			var resp *responses.Response
			var err error
			if mode.stream {
				resp, err = streamResponse(t, client, what, params, &raw)
			} else {
				resp, err = client.Responses.New(t.Context(), params, option.WithResponseInto(&raw))
			}
			var apiErr *openai.Error
			if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound {
				ss.notFound = append(ss.notFound, fmt.Sprintf("%s: %s", what, apiErr.Message))
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			tn := rig.routed(t, what, raw)
			tn.prompt, tn.cached = resp.Usage.InputTokens, resp.Usage.InputTokensDetails.CachedTokens
			ss.turns = append(ss.turns, tn)
			if resp.ID == "" || resp.Status != responses.ResponseStatusCompleted || len(resp.Output) != 1 || tn.prompt == 0 {
				t.Fatalf("%s: response %q status %q with %d output items and %d input tokens", what, resp.ID, resp.Status, len(resp.Output), tn.prompt)
			}
			if mode.chained && resp.PreviousResponseID != ss.prevID {
				t.Fatalf("%s: the response continues %q, the request named %q", what, resp.PreviousResponseID, ss.prevID)
			}
			ss.prevID = resp.ID
			ss.next = nil
			for _, item := range resp.Output {
				switch item.Type {
				case "function_call":
					fc := item.AsFunctionCall()
					if bad := checkToolCall(fc.Name, fc.Arguments); bad != "" || fc.CallID == "" {
						t.Fatalf("%s: %s (call id %q)", what, bad, fc.CallID)
					}
					ss.calls++
					if !mode.chained {
						p := fc.ToParam()
						ss.history = append(ss.history, responses.ResponseInputItemUnionParam{OfFunctionCall: &p})
					}
					out := responses.ResponseInputItemParamOfFunctionCallOutput(sdkToolResult(s, turn, fc.Name))
					out.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
					ss.next = append(ss.next, out)
				case "message":
					m := item.AsMessage()
					if len(m.Content) == 0 || m.Content[0].Type != "output_text" {
						t.Fatalf("%s: message item without output text: %s", what, item.RawJSON())
					}
					if !mode.chained {
						p := m.ToParam()
						ss.history = append(ss.history, responses.ResponseInputItemUnionParam{OfOutputMessage: &p})
					}
					ss.next = append(ss.next, responses.ResponseInputItemParamOfMessage(sdkFollowUp(s, turn), responses.EasyInputMessageRoleUser))
				default:
					t.Fatalf("%s: output item of type %q", what, item.Type)
				}
			}
		}
	}
	return sessions
}

// streamResponse sends params as a streaming request, checks the events as the SDK decoded them
// (one numbered sequence; created, then the item's deltas, then completed; the deltas add up to
// the completed response's output) and returns the response of the response.completed event.
func streamResponse(t *testing.T, client openai.Client, what string, params responses.ResponseNewParams, raw **http.Response) (*responses.Response, error) {
	t.Helper()
	stream := client.Responses.NewStreaming(t.Context(), params, option.WithResponseInto(raw))
	defer stream.Close()
	var (
		created   string
		completed *responses.Response
		seq       int64
		events    int
		deltas    = map[string]*strings.Builder{} // item id → its text or arguments deltas
	)
	add := func(item, delta string) {
		if deltas[item] == nil {
			deltas[item] = &strings.Builder{}
		}
		deltas[item].WriteString(delta)
	}
	for stream.Next() {
		ev := stream.Current()
		if events > 0 && ev.SequenceNumber != seq+1 {
			t.Fatalf("%s: event %d (%s) has sequence number %d after %d", what, events, ev.Type, ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		events++
		if completed != nil {
			t.Fatalf("%s: event %s after response.completed", what, ev.Type)
		}
		switch ev.Type {
		case "response.created":
			created = ev.AsResponseCreated().Response.ID
		case "response.output_text.delta":
			add(ev.ItemID, ev.AsResponseOutputTextDelta().Delta)
		case "response.function_call_arguments.delta":
			add(ev.ItemID, ev.AsResponseFunctionCallArgumentsDelta().Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if created == "" || completed == nil || completed.ID != created {
		t.Fatalf("%s: %d events; response.created named %q, response.completed %v", what, events, created, completed != nil)
	}
	for _, item := range completed.Output {
		var want string
		switch item.Type {
		case "function_call":
			want = item.AsFunctionCall().Arguments
		case "message":
			for _, c := range item.AsMessage().Content {
				want += c.Text
			}
		}
		got := ""
		if d := deltas[item.ID]; d != nil {
			got = d.String()
		}
		if got != want || got == "" {
			t.Fatalf("%s: the deltas of %s item %s add up to %q; the completed response says %q", what, item.Type, item.ID, got, want)
		}
	}
	return completed, nil
}

// An agent on the OpenAI SDK's Responses API that chains its turns by previous_response_id and
// sends only each turn's new items, as the OpenAI Agents SDK does by default: every turn after
// the first goes to the worker that stored the response it continues, so none is answered 404,
// and that worker's prefix cache holds more of each turn than of the one before.
func TestSDKResponsesPreviousResponseIDChainStaysOnItsWorker(t *testing.T) {
	checkResponsesSessionsStayOnTheirWorkers(t, responsesMode{chained: true}, "response_id_match")
}

// An agent on the OpenAI SDK's Responses API that resends its whole input every turn with its
// conversation id in prompt_cache_key and store false, as Codex does: every turn of a session is
// served by one worker, by session match after the first, whose prefix cache holds more of each
// turn than of the one before.
func TestSDKResponsesFullInputWithPromptCacheKeyStaysOnItsWorker(t *testing.T) {
	checkResponsesSessionsStayOnTheirWorkers(t, responsesMode{}, "session_id_match")
}

// checkResponsesSessionsStayOnTheirWorkers runs the Responses sessions in mode through a
// cache_aware router, streamed and not: no turn is answered 404, the worker calls a tool in at
// least 3 turns of each session, and every turn after the first is routed by label to the worker
// whose prefix cache holds more of it than of the turn before.
func checkResponsesSessionsStayOnTheirWorkers(t *testing.T, mode responsesMode, label string) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			rig := startSDKRig(t, "cache_aware")
			mode.stream = stream
			for _, ss := range runResponsesSessions(t, rig, mode) {
				if len(ss.notFound) > 0 {
					t.Errorf("%s: answered 404: %v", ss.id, ss.notFound)
					continue
				}
				if ss.calls < 3 {
					t.Errorf("%s: the worker called a tool in %d of %d turns, want at least 3", ss.id, ss.calls, sdkTurns)
				}
				rig.checkSessionKeptItsCache(t, ss.id, ss.turns, label)
			}
		})
	}
}

// The control of the chained test: a round_robin router does not follow response ids, so a
// previous_response_id chain reaches a worker that never stored the response it continues, and
// the SDK returns that worker's 404 as an *openai.Error. This is what the chained test would
// see if cache_aware stopped following the ids.
func TestSDKResponsesChainThroughRoundRobinIsAnsweredNotFound(t *testing.T) {
	rig := startSDKRig(t, "round_robin")
	sessions := runResponsesSessions(t, rig, responsesMode{chained: true})
	for _, ss := range sessions {
		if len(ss.notFound) == 0 {
			t.Errorf("%s: %d turns and no 404: %v", ss.id, len(ss.turns), ss.turns)
			continue
		}
		if len(ss.turns) == 0 || !strings.Contains(strings.ToLower(ss.notFound[0]), "not found") {
			t.Errorf("%s: after %d turns, %v", ss.id, len(ss.turns), ss.notFound)
		}
	}
}

// A Claude Code-like agent on the Anthropic SDK's Messages API, streaming, with a tool loop:
// tool_use blocks are answered with tool_result blocks, and every turn resends the whole
// conversation. The session is metadata.user_id for two sessions and the
// x-claude-code-session-id header for the third. Every turn of a session is served by one worker,
// whose prefix cache (cache_read_input_tokens) holds more of each turn than of the one before.
func TestSDKMessagesStreamToolLoopStaysOnItsWorkersCache(t *testing.T) {
	rig := startSDKRig(t, "cache_aware")
	client := rig.anthropic()
	var tools []anthropic.ToolUnionParam
	for _, tl := range sdkTools {
		tools = append(tools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name: tl.name, Description: anthropic.String(tl.description),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: tl.properties, Required: tl.required},
		}})
	}
	type session struct {
		id       string
		byHeader bool // x-claude-code-session-id, else metadata.user_id
		msgs     []anthropic.MessageParam
		turns    []sdkTurn
		toolUses int
	}
	sessions := make([]*session, sdkSessions)
	for s := range sessions {
		sessions[s] = &session{id: fmt.Sprintf("claude-session-%d", s), byHeader: s == sdkSessions-1,
			msgs: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(sdkTask(s)))}}
	}
	for turn := 1; turn <= sdkTurns; turn++ {
		for s, ss := range sessions {
			what := fmt.Sprintf("%s turn %d", ss.id, turn)
			params := anthropic.MessageNewParams{
				Model: sdkModel, MaxTokens: sdkMaxTokens, Messages: ss.msgs, Tools: tools,
				System: []anthropic.TextBlockParam{{Text: sdkSystem}},
			}
			var raw *http.Response
			opts := []anthropicoption.RequestOption{anthropicoption.WithResponseInto(&raw)}
			if ss.byHeader {
				opts = append(opts, anthropicoption.WithHeader("x-claude-code-session-id", ss.id))
			} else {
				params.Metadata.UserID = anthropic.String(ss.id)
			}
			stream := client.Messages.NewStreaming(t.Context(), params, opts...)
			var msg anthropic.Message
			events := 0
			for stream.Next() {
				events++
				if err := msg.Accumulate(stream.Current()); err != nil {
					t.Fatalf("%s: event %d (%s): %v", what, events, stream.Current().Type, err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("%s: stream: %v", what, err)
			}
			_ = stream.Close()
			tn := rig.routed(t, what, raw)
			tn.prompt = msg.Usage.InputTokens + msg.Usage.CacheReadInputTokens + msg.Usage.CacheCreationInputTokens
			tn.cached = msg.Usage.CacheReadInputTokens
			ss.turns = append(ss.turns, tn)
			if msg.ID == "" || msg.Role != "assistant" || len(msg.Content) == 0 || msg.Usage.OutputTokens == 0 || tn.prompt == 0 {
				t.Fatalf("%s: %d events accumulated to message %q, role %q, %d blocks, usage %s",
					what, events, msg.ID, msg.Role, len(msg.Content), msg.Usage.RawJSON())
			}
			var results []anthropic.ContentBlockParamUnion
			for _, block := range msg.Content {
				switch block.Type {
				case "tool_use":
					use := block.AsToolUse()
					if bad := checkToolCall(use.Name, string(use.Input)); bad != "" || use.ID == "" {
						t.Fatalf("%s: %s (tool_use id %q)", what, bad, use.ID)
					}
					results = append(results, anthropic.NewToolResultBlock(use.ID, sdkToolResult(s, turn, use.Name), false))
				case "text":
				default:
					t.Fatalf("%s: content block of type %q", what, block.Type)
				}
			}
			wantStop := anthropic.StopReasonEndTurn
			if len(results) > 0 {
				wantStop = anthropic.StopReasonToolUse
				ss.toolUses++
			}
			if msg.StopReason != wantStop && !(len(results) == 0 && msg.StopReason == anthropic.StopReasonMaxTokens) {
				t.Fatalf("%s: stop_reason %q with %d tool_use blocks", what, msg.StopReason, len(results))
			}
			ss.msgs = append(ss.msgs, msg.ToParam())
			if len(results) == 0 {
				results = append(results, anthropic.NewTextBlock(sdkFollowUp(s, turn)))
			}
			ss.msgs = append(ss.msgs, anthropic.NewUserMessage(results...))
		}
	}
	for _, ss := range sessions {
		if ss.toolUses < 3 {
			t.Errorf("%s: the worker used a tool in %d of %d turns, want at least 3", ss.id, ss.toolUses, sdkTurns)
		}
		rig.checkSessionKeptItsCache(t, ss.id, ss.turns, "session_id_match")
	}
}
