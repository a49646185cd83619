package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// The Anthropic Messages API (POST /v1/messages and /v1/messages/count_tokens),
// answered in Anthropic's shapes, errors included.
//
// A request renders through the chat template as vLLM's Messages serving
// converts it to a chat request: system (a string, or its text blocks
// concatenated, Claude Code's x-anthropic-billing-header block left out) as
// the first system message, then the messages:
//
//	user tool_result blocks        a tool message each, in block order: a
//	                               string, or its text blocks joined by
//	                               newlines (its images follow it as a user
//	                               message)
//	user text and image blocks     then one user message (text concatenated,
//	                               an image as <|image|> and its URL, or a
//	                               data URL for base64 data); none when the
//	                               message has no text or image
//	assistant text blocks          the assistant message's content
//	assistant tool_use blocks      its tool calls: name and the input as
//	                               Python's json.dumps writes it, as vLLM
//	                               writes the arguments
//	system messages                a system message in place (text
//	                               blocks concatenated)
//	thinking and other blocks      not rendered
//
// Tools ({name, description, input_schema}) render as the chat tools
// [{type:function, function:{name, description, parameters}}]; server tools
// (those with a type other than "custom") are ignored.
//
// Usage maps the simulator's prompt and cached tokens onto Anthropic's
// fields, whose input_tokens excludes cache reads: input_tokens is the
// uncached prompt tokens, cache_read_input_tokens the cached ones (their sum
// is the prompt), cache_creation_input_tokens is always 0.

type messagesRequest struct {
	Model      string              `json:"model"`
	MaxTokens  *int                `json:"max_tokens"`
	System     json.RawMessage     `json:"system"`
	Messages   *[]anthropicMessage `json:"messages"`
	Tools      json.RawMessage     `json:"tools"`
	ToolChoice json.RawMessage     `json:"tool_choice"`
	Stream     bool                `json:"stream"`
	Metadata   json.RawMessage     `json:"metadata"`
	// IgnoreEOS is vLLM's sampling extension, honoured as on chat: the
	// output is exactly max_tokens long.
	IgnoreEOS bool `json:"ignore_eos"`
	// Every other field (thinking, context_management, output_config,
	// temperature, stop_sequences, service_tier …) is accepted and ignored,
	// as vLLM ignores what it does not model; so is the ?beta=true query.

	// lastUser is set by conversation: the index of the message rendered
	// from the user's last own message (-1: none), for the tool-call rule.
	lastUser int
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"` // of a tool_result
	Source  *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type messagesResponse struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"` // "message"
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"` // protocol.TextBlock, protocol.ToolUseBlock
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

// conversation returns the chat messages the request renders as.
func (r *messagesRequest) conversation() ([]prompt.Message, error) {
	if r.Messages == nil {
		return nil, badf("messages: Field required")
	}
	in := *r.Messages
	if len(in) == 0 {
		return nil, badf("messages: at least one message is required")
	}
	msgs := make([]prompt.Message, 0, len(in)+1)
	system, err := systemText(r.System)
	if err != nil {
		return nil, badf("system: %v", err)
	}
	if system != "" {
		msgs = append(msgs, prompt.Message{Role: "system", Content: system})
	}
	r.lastUser = -1
	for i := range in {
		m := &in[i]
		switch m.Role {
		case "user", "assistant":
		case "system":
			// A system message among the messages, as vLLM accepts it
			// (Claude Code sends its agent list so to a model it does not
			// know): rendered in place, text blocks concatenated.
			text, err := systemText(m.Content)
			if err != nil {
				return nil, badf("messages.%d.content: %v", i, err)
			}
			msgs = append(msgs, prompt.Message{Role: "system", Content: text})
			continue
		default:
			return nil, badf("messages.%d.role: Input should be 'user', 'assistant' or 'system'", i)
		}
		text, blocks, list, err := textOrList[anthropicBlock](m.Content, "blocks")
		if err != nil {
			return nil, badf("messages.%d.content: %v", i, err)
		}
		if !list {
			if m.Role == "user" {
				r.lastUser = len(msgs)
			}
			msgs = append(msgs, prompt.Message{Role: m.Role, Content: text})
			continue
		}
		if m.Role == "assistant" {
			msgs = append(msgs, assistantBlocks(blocks))
			continue
		}
		// As vLLM converts it: the tool results first, then the user's own
		// text and images as one message, if any.
		var own strings.Builder
		hasOwn, results := false, false
		for k := range blocks {
			b := &blocks[k]
			switch b.Type {
			case "tool_result":
				text, images, err := toolResultText(b.Content)
				if err != nil {
					return nil, badf("messages.%d.content.%d.content: %v", i, k, err)
				}
				msgs = append(msgs, prompt.Message{Role: "tool", Content: text})
				if images != "" {
					msgs = append(msgs, prompt.Message{Role: "user", Content: images})
				}
				results = true
			case "text", "image":
				if b.Type == "text" && b.Text == "" {
					continue
				}
				own.WriteString(blockText(b))
				hasOwn = true
			}
		}
		if hasOwn {
			msgs = append(msgs, prompt.Message{Role: "user", Content: own.String()})
			if !results {
				r.lastUser = len(msgs) - 1
			}
		}
	}
	return msgs, nil
}

// assistantBlocks reduces an assistant message's blocks to one message.
func assistantBlocks(blocks []anthropicBlock) prompt.Message {
	m := prompt.Message{Role: "assistant"}
	var text strings.Builder
	for k := range blocks {
		b := &blocks[k]
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			args := "{}"
			if in := bytes.TrimSpace(b.Input); len(in) > 0 && string(in) != "null" {
				if a, err := protocol.PythonJSON(in); err == nil {
					args = a
				}
			}
			m.ToolCalls = append(m.ToolCalls, prompt.ToolCall{Name: b.Name, Arguments: args})
		}
	}
	m.Content = text.String()
	return m
}

// blockText renders a text or image block.
func blockText(b *anthropicBlock) string {
	if b.Type == "text" {
		return b.Text
	}
	if b.Source == nil {
		return "<|image|>"
	}
	if b.Source.Type == "base64" {
		return "<|image|>data:" + b.Source.MediaType + ";base64," + b.Source.Data
	}
	return "<|image|>" + b.Source.URL
}

// systemText reduces a system prompt or a system message (absent, a string
// or a list of blocks) to text as vLLM does: its text blocks concatenated,
// Claude Code's billing header block (a hash of each request) left out.
func systemText(raw json.RawMessage) (string, error) {
	text, blocks, list, err := textOrList[anthropicBlock](raw, "blocks")
	if !list || err != nil {
		return text, err
	}
	var b strings.Builder
	for k := range blocks {
		if blocks[k].Type == "text" && !strings.HasPrefix(blocks[k].Text, billingHeader) {
			b.WriteString(blocks[k].Text)
		}
	}
	return b.String(), nil
}

// billingHeader starts the system block in which Claude Code sends a hash of
// each request.
const billingHeader = "x-anthropic-billing-header"

// toolResultText reduces a tool result's content (absent, a string or a list
// of blocks) as vLLM does: its text blocks joined by newlines, and its images
// apart, rendered for the user message that follows the tool message.
func toolResultText(raw json.RawMessage) (text, images string, err error) {
	text, blocks, list, err := textOrList[anthropicBlock](raw, "blocks")
	if !list || err != nil {
		return text, "", err
	}
	var texts []string
	var img strings.Builder
	for k := range blocks {
		switch blocks[k].Type {
		case "text":
			texts = append(texts, blocks[k].Text)
		case "image":
			img.WriteString(blockText(&blocks[k]))
		}
	}
	return strings.Join(texts, "\n"), img.String(), nil
}

// anthropicTools reads the tools field: the chat-shaped JSON the template
// renders and the function specs for the tool-call rule.
func anthropicTools(raw json.RawMessage) ([]byte, []toolSpec, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	var tools []flatTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, nil, badf("tools: expected a list of tools")
	}
	return convertFlatTools(tools, func(typ string) bool { return typ == "" || typ == "custom" },
		func(t *flatTool) json.RawMessage { return t.InputSchema },
		func(i int) error { return badf("tools.%d.name: Field required", i) })
}

// anthropicToolChoice reads tool_choice: {"type":"auto"|"any"|"tool"|"none"}.
func anthropicToolChoice(raw json.RawMessage) (toolChoice, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return toolChoice{}, nil
	}
	var c struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return toolChoice{}, badf("tool_choice: expected an object")
	}
	switch c.Type {
	case "auto":
		return toolChoice{}, nil
	case "any":
		return toolChoice{required: true}, nil
	case "none":
		return toolChoice{none: true}, nil
	case "tool":
		if c.Name == "" {
			return toolChoice{}, badf("tool_choice.name: Field required")
		}
		return toolChoice{name: c.Name}, nil
	}
	return toolChoice{}, badf("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
}

// writeMessagesError writes err as a 400 in Anthropic's shape when it is a
// badRequest, else as a 500.
func (w *Worker) writeMessagesError(rw http.ResponseWriter, err error) {
	code, msg := errorStatus(err)
	typ := "invalid_request_error"
	if code >= 500 {
		typ = "api_error"
	}
	w.writeAnthropicError(rw, code, typ, msg)
}

// readMessages decodes a Messages API body and renders its prompt into seq.
// On failure it has answered the client and returns ok false.
func (w *Worker) readMessages(rw http.ResponseWriter, r *http.Request, req *messagesRequest, seq *prompt.Sequence) (model string, msgs []prompt.Message, specs []toolSpec, choice toolChoice, ok bool) {
	err := readJSON(rw, r, req)
	if err != nil {
		w.writeMessagesError(rw, err)
		return
	}
	model, ok = w.resolveModel(req.Model)
	if !ok {
		w.writeAnthropicError(rw, http.StatusNotFound, "not_found_error", "model: "+req.Model)
		return
	}
	ok = false
	if msgs, err = req.conversation(); err != nil {
		w.writeMessagesError(rw, err)
		return
	}
	tools, specs, err := anthropicTools(req.Tools)
	if err != nil {
		w.writeMessagesError(rw, err)
		return
	}
	if choice, err = anthropicToolChoice(req.ToolChoice); err != nil {
		w.writeMessagesError(rw, err)
		return
	}
	prompt.RenderChat(seq, tools, msgs, true)
	return model, msgs, specs, choice, true
}

func (w *Worker) handleCountTokens(rw http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	seq := seqPool.Get().(*prompt.Sequence)
	seq.Reset()
	defer seqPool.Put(seq)
	if _, _, _, _, ok := w.readMessages(rw, r, &req, seq); !ok {
		return
	}
	writeJSON(rw, http.StatusOK, struct {
		InputTokens int `json:"input_tokens"`
	}{seq.Len()})
}

func (w *Worker) handleMessages(rw http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	seq := seqPool.Get().(*prompt.Sequence)
	seq.Reset()
	defer seqPool.Put(seq)
	model, msgs, specs, choice, ok := w.readMessages(rw, r, &req, seq)
	if !ok {
		return
	}
	if req.MaxTokens == nil {
		w.writeMessagesError(rw, badf("max_tokens: Field required"))
		return
	}
	maxTokens := *req.MaxTokens
	if maxTokens < 1 {
		w.writeMessagesError(rw, badf("max_tokens: Input should be greater than or equal to 1"))
		return
	}
	if limit := w.maxModelLen(); seq.Len() >= limit {
		w.writeMessagesError(rw, badf("prompt is too long: %d tokens > %d maximum", seq.Len(), limit-1))
		return
	}
	maxTokens = min(maxTokens, w.maxModelLen()-seq.Len())
	plan := w.planToolCall(seq, msgs, req.lastUser, specs, choice, maxTokens)
	fail500 := func(rw http.ResponseWriter, msg string) {
		w.writeAnthropicError(rw, http.StatusInternalServerError, "api_error", msg)
	}
	j, ok := w.agentJob(rw, fail500, model, seq, maxTokens, req.IgnoreEOS, plan)
	if !ok {
		return
	}
	resp := &messagesResponse{ID: newID("msg_"), Type: "message", Role: "assistant", Model: model, Content: []any{}}
	toolUseID := newID("toolu_")
	if req.Stream {
		w.streamMessage(rw, r, j, plan, resp, toolUseID)
		return
	}
	text, res, ok := w.agentReply(rw, r, fail500, j)
	if !ok {
		return
	}
	completeMessage(resp, res, plan, toolUseID, text)
	b, err := marshalNoEscape(resp)
	if err != nil {
		w.writeMessagesError(rw, err)
		return
	}
	writeRawJSON(rw, http.StatusOK, b)
}

// stopReason is Anthropic's name for how the reply ended.
func stopReason(res Result, plan *plannedCall) string {
	switch {
	case plan != nil:
		return "tool_use"
	case res.FinishReason == "length":
		return "max_tokens"
	default:
		return "end_turn"
	}
}

func messagesUsage(res Result) anthropicUsage {
	return anthropicUsage{InputTokens: res.PromptTokens - res.CachedTokens, CacheReadInputTokens: res.CachedTokens,
		OutputTokens: res.CompletionTokens}
}

// completeMessage fills in the finished message.
func completeMessage(resp *messagesResponse, res Result, plan *plannedCall, toolUseID, text string) {
	if plan != nil {
		resp.Content = []any{protocol.ToolUseBlock{Type: "tool_use", ID: toolUseID, Name: plan.call.Name, Input: json.RawMessage(plan.call.Arguments)}}
	} else {
		resp.Content = []any{protocol.TextBlock{Type: "text", Text: text}}
	}
	reason := stopReason(res, plan)
	resp.StopReason = &reason
	resp.Usage = messagesUsage(res)
}

// streamMessage generates the reply and streams it as Messages API events.
// message_start goes out with the first token, when the prompt's cache hit
// is known; when the client leaves or the request stalls, the stream ends as
// it is.
func (w *Worker) streamMessage(rw http.ResponseWriter, r *http.Request, j *job, plan *plannedCall, resp *messagesResponse, toolUseID string) {
	paced := w.cfg.TimeScale > 0 && w.cfg.InterTokenLatency > 0
	es := newEventStream(rw, paced || j.fault == FailStall)
	es.start()
	type indexed struct {
		Index int `json:"index"`
	}
	first := true
	at := 0                     // bytes of the script sent so far
	promptTokens := j.seq.Len() // generate appends the reply to j.seq
	res := w.generate(r.Context(), j, func(tok string) error {
		if first {
			first = false
			start := *resp
			start.Usage = anthropicUsage{InputTokens: promptTokens - j.cached, CacheReadInputTokens: j.cached, OutputTokens: 1}
			var block any = protocol.TextBlock{Type: "text", Text: ""}
			if plan != nil {
				block = protocol.ToolUseBlock{Type: "tool_use", ID: toolUseID, Name: plan.call.Name, Input: json.RawMessage("{}")}
			}
			if err := es.send("message_start", nil, struct {
				Message *messagesResponse `json:"message"`
			}{&start}, false); err != nil {
				return err
			}
			if err := es.send("content_block_start", []byte(`"index":0`), struct {
				ContentBlock any `json:"content_block"`
			}{block}, false); err != nil {
				return err
			}
			if err := es.send("ping", nil, nil, false); err != nil {
				return err
			}
		}
		type delta struct {
			Type        string `json:"type"`
			Text        string `json:"text,omitempty"`
			PartialJSON string `json:"partial_json,omitempty"`
		}
		d := delta{Type: "text_delta", Text: tok}
		if plan != nil {
			part := plan.argsPart(tok, at)
			at += len(tok)
			if part == "" {
				return nil
			}
			d = delta{Type: "input_json_delta", PartialJSON: part}
		}
		return es.send("content_block_delta", []byte(`"index":0`), struct {
			Delta delta `json:"delta"`
		}{d}, es.flushEach)
	})
	if res.Err != nil {
		return
	}
	if es.send("content_block_stop", nil, indexed{0}, false) != nil {
		return
	}
	reason := stopReason(res, plan)
	type stop struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	if es.send("message_delta", nil, struct {
		Delta stop           `json:"delta"`
		Usage anthropicUsage `json:"usage"`
	}{stop{StopReason: reason}, messagesUsage(res)}, false) != nil {
		return
	}
	es.send("message_stop", nil, nil, true)
}
