package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// The OpenAI Responses API, in the shapes vLLM serves it.
//
// A turn renders through the chat template exactly as the equivalent chat
// request would: instructions as the first system message, then the
// conversation. With previous_response_id the conversation is the stored
// response's (its predecessor's conversation and output, its own input), its
// output, then the new input; the previous turn's instructions are not
// carried over (the new request's instructions, if any, come first). Input
// items map onto chat messages:
//
//	message {role, content}        a message of that role (user, system,
//	                               developer); text parts (input_text,
//	                               output_text, refusal) concatenated,
//	                               input_image as <|image|>URL
//	assistant message              its content's first part's text, as vLLM
//	                               takes it, filling an assistant message of
//	                               calls only just before it, else its own
//	function_call {name, arguments} a tool call of the assistant message
//	                               before it, or of a new assistant message
//	                               (within the items: never one of a stored
//	                               conversation, as in vLLM)
//	function_call_output {output}  a tool message
//	reasoning and any other item   not rendered
//
// Function tools ({type:function, name, description, parameters}) render as
// the chat tools [{type:function, function:{name, description, parameters}}];
// other tool types are ignored.

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Metadata           json.RawMessage `json:"metadata"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	// IgnoreEOS is vLLM's sampling extension, honoured as on chat: the
	// output is exactly max_output_tokens long.
	IgnoreEOS bool `json:"ignore_eos"`
}

type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

type responsesPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
	FileID   string `json:"file_id"`
}

// Response shapes.

type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Background         bool            `json:"background"`
	Error              any             `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	Output             []any           `json:"output"` // *respMessage, *respFunctionCall
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Reasoning          any             `json:"reasoning"`
	ServiceTier        string          `json:"service_tier"`
	Store              bool            `json:"store"`
	Temperature        float64         `json:"temperature"`
	Text               any             `json:"text"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	Usage              *responsesUsage `json:"usage"`
	User               any             `json:"user"`
}

type respMessage struct {
	Type    string           `json:"type"` // "message"
	ID      string           `json:"id"`
	Role    string           `json:"role"`
	Status  string           `json:"status"`
	Content []respOutputText `json:"content"`
}

type respOutputText struct {
	Type        string `json:"type"` // "output_text"
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

type respFunctionCall struct {
	Type      string `json:"type"` // "function_call"
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// parseResponsesInput decodes the input field: a string (one user message)
// or a list of items. It returns the items and each item's JSON as sent.
func parseResponsesInput(raw json.RawMessage) ([]responsesItem, []json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, badf("input: field required")
	}
	switch raw[0] {
	case '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, nil, badf("input: %v", err)
		}
		item, _ := marshalNoEscape(map[string]any{
			"type": "message", "role": "user",
			"content": []map[string]string{{"type": "input_text", "text": text}},
		})
		return []responsesItem{{Type: "message", Role: "user", Content: raw}}, []json.RawMessage{item}, nil
	case '[':
	default:
		return nil, nil, badf("input: expected a string or a list of items")
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, nil, badf("input: %v", err)
	}
	items := make([]responsesItem, len(raws))
	for i, r := range raws {
		if err := json.Unmarshal(r, &items[i]); err != nil {
			var typ *json.UnmarshalTypeError
			if errors.As(err, &typ) {
				return nil, nil, badf("input[%d].%s: expected %s, got JSON %s", i, typ.Field, typ.Type, typ.Value)
			}
			return nil, nil, badf("input[%d]: expected an object", i)
		}
	}
	return items, raws, nil
}

// responsesConversation is the chat a turn renders as: the instructions, the
// stored conversation it continues (prev, or nil) from historyAt, the items.
func responsesConversation(instructions *string, prev *storedResponse, items []responsesItem) (msgs []prompt.Message, historyAt int, err error) {
	if prev != nil {
		msgs = make([]prompt.Message, 0, len(prev.history)+len(items)+3)
	}
	if instructions != nil && *instructions != "" {
		msgs = append(msgs, prompt.Message{Role: "system", Content: *instructions})
	}
	historyAt = len(msgs)
	if prev != nil {
		msgs = append(msgs, prev.history...)
		msgs = appendOutputItems(msgs, prev.resp.Output)
	}
	msgs, err = appendResponsesItems(msgs, items)
	return msgs, historyAt, err
}

// appendResponsesItems appends the chat messages the items render as, as
// vLLM converts them: a function call joins the assistant message just
// before it, an assistant message takes its first part's text and fills the
// content of an assistant message of calls only just before it; neither
// reaches back before the items' first (into a stored conversation).
func appendResponsesItems(msgs []prompt.Message, items []responsesItem) ([]prompt.Message, error) {
	first := len(msgs)
	contentless := false // the last message is an assistant message of calls only, from the items
	for i := range items {
		it := &items[i]
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message" // an easy input message: {role, content}
		}
		lastAssistant := len(msgs) > first && msgs[len(msgs)-1].Role == "assistant"
		switch typ {
		case "message":
			switch it.Role {
			case "user", "assistant", "system", "developer":
			case "":
				return nil, badf("input[%d].role: field required", i)
			default:
				return nil, badf("input[%d].role: expected user, assistant, system or developer, got %q", i, it.Role)
			}
			if it.Role == "assistant" {
				text, err := firstPartText(it.Content)
				if err != nil {
					return nil, badf("input[%d].content: %v", i, err)
				}
				if lastAssistant && contentless {
					msgs[len(msgs)-1].Content = text
				} else {
					msgs = append(msgs, prompt.Message{Role: "assistant", Content: text})
				}
				contentless = false
				continue
			}
			text, err := responsesContentText(it.Content)
			if err != nil {
				return nil, badf("input[%d].content: %v", i, err)
			}
			msgs = append(msgs, prompt.Message{Role: it.Role, Content: text})
			contentless = false
		case "function_call":
			if it.Name == "" {
				return nil, badf("input[%d].name: field required", i)
			}
			tc := prompt.ToolCall{Name: it.Name, Arguments: it.Arguments}
			if lastAssistant {
				msgs = appendToolCall(msgs, tc)
			} else {
				msgs = append(msgs, prompt.Message{Role: "assistant", ToolCalls: []prompt.ToolCall{tc}})
				contentless = true
			}
		case "function_call_output":
			if it.CallID == "" {
				return nil, badf("input[%d].call_id: field required", i)
			}
			text, err := responsesContentText(it.Output)
			if err != nil {
				return nil, badf("input[%d].output: %v", i, err)
			}
			msgs = append(msgs, prompt.Message{Role: "tool", Content: text})
			contentless = false
		}
	}
	return msgs, nil
}

// firstPartText is what vLLM takes of an assistant message's content: a
// string, or its first part's text.
func firstPartText(raw json.RawMessage) (string, error) {
	text, parts, list, err := textOrList[responsesPart](raw, "parts")
	if !list || err != nil || len(parts) == 0 {
		return text, err
	}
	return parts[0].Text, nil
}

// appendToolCall adds tc to the assistant message at the end of msgs, or
// appends a new assistant message for it. The message's tool calls are
// copied, never extended in place: stored conversations share them.
func appendToolCall(msgs []prompt.Message, tc prompt.ToolCall) []prompt.Message {
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
		last := &msgs[n-1]
		last.ToolCalls = append(last.ToolCalls[:len(last.ToolCalls):len(last.ToolCalls)], tc)
		return msgs
	}
	return append(msgs, prompt.Message{Role: "assistant", ToolCalls: []prompt.ToolCall{tc}})
}

// appendOutputItems appends the chat messages a response's output renders as.
func appendOutputItems(msgs []prompt.Message, output []any) []prompt.Message {
	for _, it := range output {
		switch it := it.(type) {
		case *respMessage:
			var b strings.Builder
			for _, c := range it.Content {
				b.WriteString(c.Text)
			}
			msgs = append(msgs, prompt.Message{Role: "assistant", Content: b.String()})
		case *respFunctionCall:
			msgs = appendToolCall(msgs, prompt.ToolCall{Name: it.Name, Arguments: it.Arguments})
		}
	}
	return msgs
}

// responsesContentText reduces a message content or a function call output
// (absent, a string or a list of parts) to text.
func responsesContentText(raw json.RawMessage) (string, error) {
	text, parts, list, err := textOrList[responsesPart](raw, "parts")
	if !list || err != nil {
		return text, err
	}
	var b strings.Builder
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text", "summary_text", "reasoning_text":
			b.WriteString(p.Text)
		case "refusal":
			b.WriteString(p.Refusal)
		case "input_image":
			b.WriteString("<|image|>")
			if p.ImageURL != "" {
				b.WriteString(p.ImageURL)
			} else {
				b.WriteString(p.FileID)
			}
		}
	}
	return b.String(), nil
}

// responsesTools reads the tools field: the chat-shaped JSON the template
// renders, the function specs for the tool-call rule, and the tools as sent
// (compacted) for the response object.
func responsesTools(raw json.RawMessage) (rendered []byte, specs []toolSpec, echo json.RawMessage, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, json.RawMessage("[]"), nil
	}
	var tools []flatTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, nil, nil, badf("tools: expected a list of tools")
	}
	rendered, specs, err = convertFlatTools(tools, func(typ string) bool { return typ == "function" },
		func(t *flatTool) json.RawMessage { return t.Parameters },
		func(i int) error { return badf("tools[%d].name: field required", i) })
	if err != nil {
		return nil, nil, nil, err
	}
	var c bytes.Buffer
	_ = json.Compact(&c, raw)
	return rendered, specs, c.Bytes(), nil
}

// responsesToolChoice reads tool_choice: "auto", "none", "required", or an
// object naming a function ({"type":"function","name":...}).
func responsesToolChoice(raw json.RawMessage) (toolChoice, json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return toolChoice{}, json.RawMessage(`"auto"`), nil
	}
	var c bytes.Buffer
	_ = json.Compact(&c, raw)
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto":
			return toolChoice{}, c.Bytes(), nil
		case "required":
			return toolChoice{required: true}, c.Bytes(), nil
		case "none":
			return toolChoice{none: true}, c.Bytes(), nil
		}
		return toolChoice{}, nil, badf("tool_choice: expected auto, none, required or an object, got %q", mode)
	}
	var named struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return toolChoice{}, nil, badf("tool_choice: expected auto, none, required or an object")
	}
	return toolChoice{name: named.Name}, c.Bytes(), nil
}

// writeResponsesError writes err as a 400 in OpenAI's shape when it is a
// badRequest, else as a 500.
func (w *Worker) writeResponsesError(rw http.ResponseWriter, err error) {
	code, msg := errorStatus(err)
	w.writeOpenAIError(rw, code, openAIErrorType(code), msg)
}

// writeResponseNotFound answers an id the worker does not hold, as vLLM does.
func (w *Worker) writeResponseNotFound(rw http.ResponseWriter, id string) {
	w.writeOpenAIError(rw, http.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", id))
}

func (w *Worker) handleResponses(rw http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if err := readJSON(rw, r, &req); err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	model, ok := w.resolveModel(req.Model)
	if !ok {
		w.writeOpenAIError(rw, http.StatusNotFound, "NotFoundError", "The model `"+req.Model+"` does not exist.")
		return
	}
	var prev *storedResponse
	if req.PreviousResponseID != nil {
		if prev, ok = w.stored.get(*req.PreviousResponseID); !ok {
			w.writeResponseNotFound(rw, *req.PreviousResponseID)
			return
		}
	}
	items, rawItems, err := parseResponsesInput(req.Input)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	tools, specs, toolsEcho, err := responsesTools(req.Tools)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	choice, choiceEcho, err := responsesToolChoice(req.ToolChoice)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}

	msgs, historyAt, err := responsesConversation(req.Instructions, prev, items)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	if len(msgs) == 0 {
		w.writeResponsesError(rw, badf("input: at least one item is required"))
		return
	}
	maxTokens := w.cfg.DefaultMaxTokens
	if req.MaxOutputTokens != nil {
		maxTokens = *req.MaxOutputTokens
	}
	if maxTokens < 1 {
		w.writeResponsesError(rw, badf("max_output_tokens must be at least 1, got %d", maxTokens))
		return
	}

	seq := seqPool.Get().(*prompt.Sequence)
	seq.Reset()
	defer seqPool.Put(seq)
	prompt.RenderChat(seq, tools, msgs, true)
	if limit := w.maxModelLen(); seq.Len() >= limit {
		w.writeOpenAIError(rw, http.StatusBadRequest, "invalid_request_error",
			fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", seq.Len(), limit))
		return
	}
	maxTokens = min(maxTokens, w.maxModelLen()-seq.Len())
	plan := w.planToolCall(seq, msgs, lastUserMessage(msgs), specs, choice, maxTokens)
	fail500 := func(rw http.ResponseWriter, msg string) {
		w.writeOpenAIError(rw, http.StatusInternalServerError, "InternalServerError", msg)
	}
	j, ok := w.agentJob(rw, fail500, model, seq, maxTokens, req.IgnoreEOS, plan)
	if !ok {
		return
	}

	store := req.Store == nil || *req.Store
	resp := &responseObject{
		ID: newID("resp_"), Object: "response", CreatedAt: unixNow(), Status: "in_progress",
		Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens, Metadata: req.Metadata,
		Model: model, Output: []any{}, ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		PreviousResponseID: req.PreviousResponseID, ServiceTier: "auto", Store: store,
		Temperature: 1, Text: map[string]any{"format": map[string]string{"type": "text"}},
		ToolChoice: choiceEcho, Tools: toolsEcho, TopP: 1, Truncation: "disabled",
	}
	if len(resp.Metadata) == 0 {
		resp.Metadata = json.RawMessage("null")
	}
	if req.Temperature != nil {
		resp.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		resp.TopP = *req.TopP
	}
	out := newResponseOutput(plan)
	// The response is stored before its last event or its body is written,
	// so a client that continues from it at once finds it.
	keep := func() {
		if store {
			history := msgs[historyAt:len(msgs):len(msgs)]
			w.stored.put(&storedResponse{resp: resp, history: history, input: withItemIDs(rawItems)})
		}
	}
	if req.Stream {
		w.streamResponse(rw, r, j, out, resp, keep)
		return
	}
	text, res, ok := w.agentReply(rw, r, fail500, j)
	if !ok {
		return
	}
	out.complete(resp, res, text)
	keep()
	b, err := marshalNoEscape(resp)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	writeRawJSON(rw, http.StatusOK, b)
}

// responseOutput is the one output item a turn produces: a message, or a
// function call when the tool-call rule calls one.
type responseOutput struct {
	plan   *plannedCall
	itemID string
	callID string
}

func newResponseOutput(plan *plannedCall) *responseOutput {
	if plan != nil {
		return &responseOutput{plan: plan, itemID: newID("fc_"), callID: newID("call_")}
	}
	return &responseOutput{itemID: newID("msg_")}
}

// item returns the output item: in progress and empty, or completed with text.
func (o *responseOutput) item(done bool, text string) any {
	status := "in_progress"
	if done {
		status = "completed"
	}
	if o.plan != nil {
		args := ""
		if done {
			args = o.plan.call.Arguments
		}
		return &respFunctionCall{Type: "function_call", ID: o.itemID, CallID: o.callID, Name: o.plan.call.Name, Arguments: args, Status: status}
	}
	m := &respMessage{Type: "message", ID: o.itemID, Role: "assistant", Status: status, Content: []respOutputText{}}
	if done {
		m.Content = append(m.Content, outputText(text))
	}
	return m
}

func outputText(text string) respOutputText {
	return respOutputText{Type: "output_text", Text: text, Annotations: []any{}, Logprobs: []any{}}
}

// complete fills in the finished response.
func (o *responseOutput) complete(resp *responseObject, res Result, text string) {
	resp.Status = "completed"
	resp.Output = []any{o.item(true, text)}
	u := &responsesUsage{InputTokens: res.PromptTokens, OutputTokens: res.CompletionTokens,
		TotalTokens: res.PromptTokens + res.CompletionTokens}
	u.InputTokensDetails.CachedTokens = res.CachedTokens
	resp.Usage = u
}

// streamResponse generates the turn and streams it as Responses API events.
// When the client leaves or the request stalls, the stream ends as it is and
// nothing is stored.
func (w *Worker) streamResponse(rw http.ResponseWriter, r *http.Request, j *job, out *responseOutput, resp *responseObject, keep func()) {
	paced := w.cfg.TimeScale > 0 && w.cfg.InterTokenLatency > 0
	es := newEventStream(rw, paced || j.fault == FailStall)
	es.start()
	seqNo := 0
	send := func(name string, fields any, flush bool) error {
		extra := strconv.AppendInt([]byte(`"sequence_number":`), int64(seqNo), 10)
		seqNo++
		return es.send(name, extra, fields, flush)
	}
	type responseEvent struct {
		Response *responseObject `json:"response"`
	}
	type itemEvent struct {
		OutputIndex int `json:"output_index"`
		Item        any `json:"item"`
	}
	type partEvent struct {
		ItemID       string         `json:"item_id"`
		OutputIndex  int            `json:"output_index"`
		ContentIndex int            `json:"content_index"`
		Part         respOutputText `json:"part"`
	}
	type textDelta struct {
		ItemID       string `json:"item_id"`
		OutputIndex  int    `json:"output_index"`
		ContentIndex int    `json:"content_index"`
		Delta        string `json:"delta"`
		Logprobs     []any  `json:"logprobs"`
	}
	type textDone struct {
		ItemID       string `json:"item_id"`
		OutputIndex  int    `json:"output_index"`
		ContentIndex int    `json:"content_index"`
		Text         string `json:"text"`
		Logprobs     []any  `json:"logprobs"`
	}
	type argsDelta struct {
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Delta       string `json:"delta"`
	}
	type argsDone struct {
		ItemID      string `json:"item_id"`
		OutputIndex int    `json:"output_index"`
		Name        string `json:"name"`
		Arguments   string `json:"arguments"`
	}

	if send("response.created", responseEvent{resp}, false) != nil ||
		send("response.in_progress", responseEvent{resp}, true) != nil {
		return
	}
	first := true
	at := 0 // bytes of the script sent so far
	var text strings.Builder
	res := w.generate(r.Context(), j, func(tok string) error {
		if first {
			first = false
			if err := send("response.output_item.added", itemEvent{0, out.item(false, "")}, false); err != nil {
				return err
			}
			if out.plan == nil {
				if err := send("response.content_part.added", partEvent{out.itemID, 0, 0, outputText("")}, false); err != nil {
					return err
				}
			}
		}
		text.WriteString(tok)
		if out.plan == nil {
			return send("response.output_text.delta", textDelta{out.itemID, 0, 0, tok, []any{}}, es.flushEach)
		}
		part := out.plan.argsPart(tok, at)
		at += len(tok)
		if part == "" {
			return nil
		}
		return send("response.function_call_arguments.delta", argsDelta{out.itemID, 0, part}, es.flushEach)
	})
	if res.Err != nil {
		return
	}
	out.complete(resp, res, text.String())
	if out.plan == nil {
		full := text.String()
		if send("response.output_text.done", textDone{out.itemID, 0, 0, full, []any{}}, false) != nil ||
			send("response.content_part.done", partEvent{out.itemID, 0, 0, outputText(full)}, false) != nil {
			return
		}
	} else if send("response.function_call_arguments.done", argsDone{out.itemID, 0, out.plan.call.Name, out.plan.call.Arguments}, false) != nil {
		return
	}
	if send("response.output_item.done", itemEvent{0, resp.Output[0]}, false) != nil {
		return
	}
	keep()
	send("response.completed", responseEvent{resp}, true)
}

// withItemIDs gives every input item an id, as stored items have one, and
// fills in the type and status a message item may leave out.
func withItemIDs(raws []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, len(raws))
	for i, raw := range raws {
		var item map[string]json.RawMessage
		if json.Unmarshal(raw, &item) != nil {
			out[i] = raw
			continue
		}
		var typ string
		_ = json.Unmarshal(item["type"], &typ)
		if typ == "" {
			typ = "message"
			item["type"] = json.RawMessage(`"message"`)
		}
		if _, ok := item["id"]; !ok {
			prefix := map[string]string{"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[typ]
			if prefix == "" {
				prefix = "item_"
			}
			id, _ := json.Marshal(newID(prefix))
			item["id"] = id
		}
		if _, ok := item["status"]; !ok && typ != "reasoning" {
			item["status"] = json.RawMessage(`"completed"`)
		}
		b, err := marshalNoEscape(item)
		if err != nil {
			b = raw
		}
		out[i] = b
	}
	return out
}

// requestedResponse is the stored response the request's path names; when there is none it
// answers 404 and returns false.
func (w *Worker) requestedResponse(rw http.ResponseWriter, r *http.Request) (*storedResponse, bool) {
	id := r.PathValue("id")
	sr, ok := w.stored.get(id)
	if !ok {
		w.writeResponseNotFound(rw, id)
	}
	return sr, ok
}

func (w *Worker) handleGetResponse(rw http.ResponseWriter, r *http.Request) {
	sr, ok := w.requestedResponse(rw, r)
	if !ok {
		return
	}
	b, err := marshalNoEscape(sr.resp)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	writeRawJSON(rw, http.StatusOK, b)
}

func (w *Worker) handleDeleteResponse(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !w.stored.delete(id) {
		w.writeResponseNotFound(rw, id)
		return
	}
	writeJSON(rw, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "response", true})
}

// handleCancelResponse answers as vLLM does: only a background response that
// is still queued or running can be cancelled, and the simulator runs none,
// so a stored response gets vLLM's 400 and an unknown id its 404.
func (w *Worker) handleCancelResponse(rw http.ResponseWriter, r *http.Request) {
	if _, ok := w.requestedResponse(rw, r); !ok {
		return
	}
	w.writeOpenAIError(rw, http.StatusBadRequest, "invalid_request_error", "Cannot cancel a synchronous response.")
}

// handleResponseInputItems lists a stored response's own input items, as
// OpenAI's API does: newest first unless order=asc, at most limit (1 to 100,
// default 20) after the item named by after.
func (w *Worker) handleResponseInputItems(rw http.ResponseWriter, r *http.Request) {
	sr, ok := w.requestedResponse(rw, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := 20
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			w.writeResponsesError(rw, badf("limit: expected an integer from 1 to 100, got %q", s))
			return
		}
		limit = n
	}
	items := make([]json.RawMessage, len(sr.input))
	switch order := q.Get("order"); order {
	case "", "desc":
		for i, it := range sr.input {
			items[len(items)-1-i] = it
		}
	case "asc":
		copy(items, sr.input)
	default:
		w.writeResponsesError(rw, badf("order: expected asc or desc, got %q", order))
		return
	}
	if after := q.Get("after"); after != "" {
		for i, it := range items {
			if itemID(it) == after {
				items = items[i+1:]
				break
			}
		}
	}
	hasMore := len(items) > limit
	if hasMore {
		items = items[:limit]
	}
	list := struct {
		Object  string            `json:"object"`
		Data    []json.RawMessage `json:"data"`
		FirstID *string           `json:"first_id"`
		LastID  *string           `json:"last_id"`
		HasMore bool              `json:"has_more"`
	}{Object: "list", Data: items, HasMore: hasMore}
	if len(items) > 0 {
		first, last := itemID(items[0]), itemID(items[len(items)-1])
		list.FirstID, list.LastID = &first, &last
	}
	b, err := marshalNoEscape(list)
	if err != nil {
		w.writeResponsesError(rw, err)
		return
	}
	writeRawJSON(rw, http.StatusOK, b)
}

func itemID(raw json.RawMessage) string {
	var it struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(raw, &it)
	return it.ID
}
