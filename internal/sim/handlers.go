package sim

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// apiKind tells the two generation endpoints apart.
type apiKind uint8

const (
	kindChat apiKind = iota
	kindCompletion
)

// decodeRequest reads the body into req and resolves the model it names. On failure it has
// already answered the client and returns false.
func (w *Worker) decodeRequest(rw http.ResponseWriter, r *http.Request, req interface{ modelName() string }) (string, bool) {
	if err := readJSON(rw, r, req); err != nil {
		w.writeClientError(rw, err)
		return "", false
	}
	model, ok := w.resolveModel(req.modelName())
	if !ok {
		w.writeUnknownModel(rw, req.modelName())
	}
	return model, ok
}

func (w *Worker) handleChat(rw http.ResponseWriter, r *http.Request) {
	var req chatRequest
	model, ok := w.decodeRequest(rw, r, &req)
	if !ok {
		return
	}
	msgs, err := req.messages()
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	tools, err := toolsJSON(req.Tools)
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	// The tool-call rule applies only when the request sets tool_choice:
	// clients that offer tools without it get text, as they always have.
	choice, explicit, err := chatToolChoice(req.ToolChoice)
	var specs []toolSpec
	if err == nil && explicit {
		specs, err = chatToolSpecs(req.Tools)
	}
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	xfer, err := parseTransfer(req.KVTransferParams)
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	maxTokens := w.chatMaxTokens(&req)
	if maxTokens < 1 {
		w.writeError(rw, http.StatusBadRequest, "max_tokens must be at least 1, got "+strconv.Itoa(maxTokens))
		return
	}

	seq := seqPool.Get().(*prompt.Sequence)
	seq.Reset()
	defer seqPool.Put(seq)
	prompt.RenderChat(seq, tools, msgs, true)
	if maxTokens, err = w.fitContext(seq.Len(), maxTokens); err != nil {
		w.writeClientError(rw, err)
		return
	}
	var plan *plannedCall
	if explicit {
		plan = w.planToolCall(seq, msgs, lastUserMessage(msgs), specs, choice, maxTokens)
	}
	fault := w.drawFault()
	if w.injectFault(rw, fault, w.fail500) {
		return
	}
	if w.refuseLostTransfer(rw, xfer) {
		return
	}
	j := &job{model: model, seq: seq, chat: true, maxTokens: maxTokens, ignoreEOS: req.IgnoreEOS, fault: fault, transfer: xfer}
	if plan != nil {
		j.script = plan.script
	}
	w.serveJobs(rw, r, kindChat, model, []*job{j}, plan, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
}

func (w *Worker) handleCompletion(rw http.ResponseWriter, r *http.Request) {
	var req completionRequest
	model, ok := w.decodeRequest(rw, r, &req)
	if !ok {
		return
	}
	prompts, err := completionPrompts(req.Prompt)
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	xfer, err := parseTransfer(req.KVTransferParams)
	if err == nil && xfer.role != colocated && len(prompts) != 1 {
		err = badf("kv_transfer_params: a prefill or decode leg takes one prompt, got %d", len(prompts))
	}
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	maxTokens := w.cfg.DefaultMaxTokens
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if maxTokens < 1 {
		w.writeError(rw, http.StatusBadRequest, "max_tokens must be at least 1, got "+strconv.Itoa(maxTokens))
		return
	}
	jobs := make([]*job, len(prompts))
	for i, p := range prompts {
		seq := seqPool.Get().(*prompt.Sequence)
		seq.Reset()
		defer seqPool.Put(seq)
		if p.isIDs {
			prompt.RenderIDs(seq, p.ids)
		} else {
			prompt.RenderText(seq, p.text)
		}
		if seq.Len() == 0 {
			w.writeError(rw, http.StatusBadRequest, "prompt: must not be empty")
			return
		}
		n, err := w.fitContext(seq.Len(), maxTokens)
		if err != nil {
			w.writeClientError(rw, err)
			return
		}
		jobs[i] = &job{model: model, seq: seq, maxTokens: n, ignoreEOS: req.IgnoreEOS, transfer: xfer}
	}
	fault := w.drawFault()
	if w.injectFault(rw, fault, w.fail500) {
		return
	}
	if w.refuseLostTransfer(rw, xfer) {
		return
	}
	for _, j := range jobs {
		j.fault = fault
	}
	w.serveJobs(rw, r, kindCompletion, model, jobs, nil, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
}

// serveJobs generates every job in turn (choice i answers job i) and writes
// the response, streamed or whole. plan, when set, is the tool call that the
// one job of a chat request makes: its choice carries the call in tool_calls
// and finishes with "tool_calls", or with "stop" when the tool choice named
// the tool, as vLLM and OpenAI answer.
func (w *Worker) serveJobs(rw http.ResponseWriter, r *http.Request, kind apiKind, model string, jobs []*job, plan *plannedCall, stream, includeUsage bool) {
	ctx := r.Context()
	id := newID("cmpl-")
	if kind == kindChat {
		id = newID("chatcmpl-")
	}
	created := unixNow()
	var u usage
	var callID string
	if plan != nil {
		callID = newID("call_")
	}
	finishReason := func(res Result) string {
		switch {
		case plan == nil:
			return res.FinishReason
		case plan.named:
			return "stop"
		default:
			return "tool_calls"
		}
	}

	if stream {
		// Flush every token when tokens are paced, or when the stream is about
		// to stall so the client sees what came before; otherwise let the
		// server buffer and flush at the end.
		paced := w.cfg.TimeScale > 0 && w.cfg.InterTokenLatency > 0
		sw := newStreamWriter(rw, kind, id, created, model, paced || jobs[0].fault == FailStall)
		// Like vLLM, answer the headers at once; chunks follow as tokens come.
		sw.start()
		for i, j := range jobs {
			first := true
			at := 0 // bytes of a tool call's script sent so far
			res := w.generate(ctx, j, func(tok string) error {
				if first && kind == kindChat {
					sw.role(i)
					if plan != nil {
						if err := sw.toolCallStart(i, callID, plan.call.Name); err != nil {
							return err
						}
					}
				}
				first = false
				if plan == nil {
					return sw.token(i, tok)
				}
				part := plan.argsPart(tok, at)
				at += len(tok)
				if part == "" {
					return nil // the marker and the name, sent in the first chunk
				}
				return sw.toolCallArguments(i, part)
			})
			if res.Err != nil {
				return // the client left or the request stalled: end the stream as is
			}
			u.add(res)
			sw.finish(i, finishReason(res))
		}
		if includeUsage {
			sw.usage(&u)
		}
		sw.done()
		return
	}

	texts := make([]strings.Builder, len(jobs))
	results := make([]Result, len(jobs))
	for i, j := range jobs {
		results[i] = w.generate(ctx, j, func(tok string) error {
			texts[i].WriteString(tok)
			return nil
		})
		if results[i].Err != nil {
			if ctx.Err() == nil {
				w.writeError(rw, http.StatusInternalServerError, "request did not finish: "+results[i].Err.Error())
			}
			return
		}
		u.add(results[i])
	}
	var handoff *kvTransferParams // a prefill leg's answer; streamed legs get none, as from vLLM
	if t := jobs[0].transfer; t.role == prefillLeg {
		handoff = w.handoffParams(r, t.holdID, t.heldBlocks)
	}
	if kind == kindChat {
		resp := response[chatChoice]{ID: id, Object: "chat.completion", Created: created, Model: model, Usage: u, KVTransferParams: handoff}
		resp.Choices = make([]chatChoice, len(jobs))
		for i := range jobs {
			c := &resp.Choices[i]
			c.Index = i
			c.Message.Role = "assistant"
			c.Message.ToolCalls = []chatToolCall{}
			if plan != nil {
				tc := chatToolCall{ID: callID, Type: "function"}
				tc.Function.Name, tc.Function.Arguments = plan.call.Name, plan.call.Arguments
				c.Message.ToolCalls = append(c.Message.ToolCalls, tc)
			} else {
				text := texts[i].String()
				c.Message.Content = &text
			}
			c.FinishReason = finishReason(results[i])
		}
		writeJSON(rw, http.StatusOK, resp)
		return
	}
	resp := response[completionChoice]{ID: id, Object: "text_completion", Created: created, Model: model, Usage: u, KVTransferParams: handoff}
	resp.Choices = make([]completionChoice, len(jobs))
	for i := range jobs {
		resp.Choices[i] = completionChoice{Index: i, Text: texts[i].String(), FinishReason: results[i].FinishReason}
	}
	writeJSON(rw, http.StatusOK, resp)
}

// streamWriter writes server-sent events in vLLM's chunk shapes. Each chunk
// is appended into one reused buffer and written with a single call.
type streamWriter struct {
	sseWriter
	kind   apiKind
	prefix []byte // `data: {"id":...,"choices":[{"index":`
	bare   []byte // `data: {"id":...,"model":...,` for the usage chunk
}

func newStreamWriter(rw http.ResponseWriter, kind apiKind, id string, created int64, model string, flushEach bool) *streamWriter {
	object := "chat.completion.chunk"
	if kind == kindCompletion {
		object = "text_completion"
	}
	var p []byte
	p = append(p, `data: {"id":`...)
	p = appendJSONString(p, id)
	p = append(p, `,"object":"`...)
	p = append(p, object...)
	p = append(p, `","created":`...)
	p = strconv.AppendInt(p, created, 10)
	p = append(p, `,"model":`...)
	p = appendJSONString(p, model)
	p = append(p, ',')
	bare := p
	return &streamWriter{
		sseWriter: newSSEWriter(rw, flushEach),
		kind:      kind,
		prefix:    append(append([]byte(nil), bare...), `"choices":[{"index":`...),
		bare:      bare,
	}
}

func (s *streamWriter) begin(i int) {
	s.buf = append(s.buf[:0], s.prefix...)
	s.buf = strconv.AppendInt(s.buf, int64(i), 10)
	s.buf = append(s.buf, ',')
}

// role writes the first chunk of a chat choice.
func (s *streamWriter) role(i int) {
	s.begin(i)
	s.buf = append(s.buf, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	s.write(false)
}

// token writes one content delta.
func (s *streamWriter) token(i int, tok string) error {
	s.begin(i)
	if s.kind == kindChat {
		s.buf = append(s.buf, `"delta":{"content":`...)
		s.buf = appendJSONString(s.buf, tok)
		s.buf = append(s.buf, `},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	} else {
		s.buf = append(s.buf, `"text":`...)
		s.buf = appendJSONString(s.buf, tok)
		s.buf = append(s.buf, `,"logprobs":null,"finish_reason":null,"stop_reason":null}]}`+"\n\n"...)
	}
	return s.write(s.flushEach)
}

// toolCallStart writes the first chunk of a chat choice's tool call: its
// index, id, type and function name, with empty arguments.
func (s *streamWriter) toolCallStart(i int, id, name string) error {
	s.begin(i)
	s.buf = append(s.buf, `"delta":{"tool_calls":[{"index":0,"id":`...)
	s.buf = appendJSONString(s.buf, id)
	s.buf = append(s.buf, `,"type":"function","function":{"name":`...)
	s.buf = appendJSONString(s.buf, name)
	s.buf = append(s.buf, `,"arguments":""}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	return s.write(s.flushEach)
}

// toolCallArguments writes one piece of a chat choice's tool call arguments.
func (s *streamWriter) toolCallArguments(i int, part string) error {
	s.begin(i)
	s.buf = append(s.buf, `"delta":{"tool_calls":[{"index":0,"function":{"arguments":`...)
	s.buf = appendJSONString(s.buf, part)
	s.buf = append(s.buf, `}}]},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
	return s.write(s.flushEach)
}

// finish writes the chunk that carries a choice's finish_reason.
func (s *streamWriter) finish(i int, reason string) {
	s.begin(i)
	if s.kind == kindChat {
		s.buf = append(s.buf, `"delta":{},"logprobs":null,"finish_reason":`...)
	} else {
		s.buf = append(s.buf, `"text":"","logprobs":null,"finish_reason":`...)
	}
	s.buf = appendJSONString(s.buf, reason)
	s.buf = append(s.buf, `,"stop_reason":null}]}`+"\n\n"...)
	s.write(false)
}

// usage writes the usage chunk (stream_options.include_usage).
func (s *streamWriter) usage(u *usage) {
	b, _ := json.Marshal(u)
	s.buf = append(s.buf[:0], s.bare...)
	s.buf = append(s.buf, `"choices":[],"usage":`...)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "}\n\n"...)
	s.write(false)
}

// done writes the terminating event and flushes.
func (s *streamWriter) done() {
	s.buf = append(s.buf[:0], "data: [DONE]\n\n"...)
	s.write(true)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// embeddingDims is the length of every embedding vector.
const embeddingDims = 32

func (w *Worker) handleEmbeddings(rw http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	model, ok := w.decodeRequest(rw, r, &req)
	if !ok {
		return
	}
	inputs, err := completionPrompts(req.Input)
	if err != nil {
		w.writeError(rw, http.StatusBadRequest, "input"+strings.TrimPrefix(err.Error(), "prompt"))
		return
	}
	type item struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}
	resp := struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Data    []item `json:"data"`
		Usage   usage  `json:"usage"`
	}{ID: newID("embd-"), Object: "list", Created: unixNow(), Model: model}
	var seq prompt.Sequence
	for i, in := range inputs {
		seq.Reset()
		if in.isIDs {
			prompt.RenderIDs(&seq, in.ids)
		} else {
			prompt.RenderText(&seq, in.text)
		}
		resp.Usage.PromptTokens += seq.Len()
		resp.Data = append(resp.Data, item{Object: "embedding", Index: i, Embedding: embed(seq.Text)})
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	writeJSON(rw, http.StatusOK, resp)
}

// embed returns a deterministic unit vector for text.
func embed(text []byte) []float64 {
	rng := rand.New(rand.NewPCG(kvcache.HashBytes(text), 0xe5bed))
	v := make([]float64, embeddingDims)
	var norm float64
	for i := range v {
		v[i] = rng.Float64()*2 - 1
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] /= norm
	}
	return v
}

func (w *Worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Root        string `json:"root"`
		Parent      any    `json:"parent"`
		MaxModelLen any    `json:"max_model_len"`
		Permission  []any  `json:"permission"`
	}
	resp := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	now := unixNow()
	for _, m := range w.cfg.Models {
		resp.Data = append(resp.Data, model{ID: m, Object: "model", Created: now, OwnedBy: "vllm",
			Root: w.cfg.Models[0], MaxModelLen: w.maxModelLen(), Permission: []any{}})
	}
	// Adapters after the base models, as vLLM lists them: the path as root, the base model as
	// parent, no context length of their own.
	for _, ad := range w.loras.all() {
		resp.Data = append(resp.Data, model{ID: ad.name, Object: "model", Created: now, OwnedBy: "vllm",
			Root: ad.path, Parent: ad.parent, Permission: []any{}})
	}
	writeJSON(rw, http.StatusOK, resp)
}

// chatMaxTokens is the output a chat request asks for: max_completion_tokens, else max_tokens,
// else the worker's default.
func (w *Worker) chatMaxTokens(req *chatRequest) int {
	switch {
	case req.MaxCompletionTokens != nil:
		return *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		return *req.MaxTokens
	}
	return w.cfg.DefaultMaxTokens
}
