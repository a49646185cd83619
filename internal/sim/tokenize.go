package sim

import (
	"encoding/json"
	"net/http"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// tokenize.go serves vLLM's POST /tokenize and POST /v1/chat/completions/render with the very
// tokens the worker's cache model hashes for the same request: the chat template and the
// tokenizer of the chat handler, each token's id as package prompt gives it, the ids its
// BlockStored events carry. A router that tokenizes a request here and chains keys over the ids
// (kvevents.Keys) therefore matches the blocks this worker published for that prompt.

// tokenizeRequest is either of vLLM's two tokenize requests: a completion prompt (prompt), or a
// chat conversation (messages, tools, add_generation_prompt, default true).
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             *[]chatMessage  `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

func (r *tokenizeRequest) modelName() string { return r.Model }

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// renderChatRequest renders a chat request's messages and tools into seq as the chat handler
// does; generate opens the assistant turn.
func renderChatRequest(seq *prompt.Sequence, req *chatRequest, generate bool) error {
	msgs, err := req.messages()
	if err != nil {
		return err
	}
	tools, err := toolsJSON(req.Tools)
	if err != nil {
		return err
	}
	prompt.RenderChat(seq, tools, msgs, generate)
	return nil
}

func (w *Worker) handleTokenize(rw http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if _, ok := w.decodeRequest(rw, r, &req); !ok {
		return
	}
	var seq prompt.Sequence
	switch {
	case req.Messages != nil && req.Prompt != nil:
		w.writeError(rw, http.StatusBadRequest, "give either prompt or messages, not both")
		return
	case req.Messages != nil:
		if req.ContinueFinalMessage {
			w.writeError(rw, http.StatusBadRequest, "continue_final_message is not supported by the simulator's chat template")
			return
		}
		generate := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if err := renderChatRequest(&seq, &chatRequest{Messages: req.Messages, Tools: req.Tools}, generate); err != nil {
			w.writeClientError(rw, err)
			return
		}
	case req.Prompt != nil:
		prompt.RenderText(&seq, *req.Prompt)
	default:
		w.writeError(rw, http.StatusBadRequest, "prompt or messages: field required")
		return
	}
	resp := tokenizeResponse{Count: seq.Len(), MaxModelLen: w.maxModelLen(), Tokens: seq.AppendIDs(make([]uint32, 0, seq.Len()), 0, seq.Len())}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, seq.Len())
		for i := range resp.TokenStrs {
			resp.TokenStrs[i] = string(seq.Token(i))
		}
	}
	writeJSON(rw, http.StatusOK, resp)
}

// handleChatRender answers a chat request as vLLM's render endpoint does, with the generate
// request it would hand an engine: the prompt's token ids and the sampling parameters, here
// only max_tokens. Nothing is generated and the cache is not touched.
func (w *Worker) handleChatRender(rw http.ResponseWriter, r *http.Request) {
	var req chatRequest
	model, ok := w.decodeRequest(rw, r, &req)
	if !ok {
		return
	}
	var seq prompt.Sequence
	if err := renderChatRequest(&seq, &req, true); err != nil {
		w.writeClientError(rw, err)
		return
	}
	maxTokens := w.chatMaxTokens(&req)
	maxTokens, err := w.fitContext(seq.Len(), maxTokens)
	if err != nil {
		w.writeClientError(rw, err)
		return
	}
	type samplingParams struct {
		MaxTokens int `json:"max_tokens"`
	}
	writeJSON(rw, http.StatusOK, struct {
		RequestID      string         `json:"request_id"`
		Model          string         `json:"model"`
		TokenIDs       []uint32       `json:"token_ids"`
		Features       any            `json:"features"`
		SamplingParams samplingParams `json:"sampling_params"`
	}{newID("chatcmpl-"), model, seq.AppendIDs(make([]uint32, 0, seq.Len()), 0, seq.Len()), nil, samplingParams{maxTokens}})
}

// CachedChatPrefix returns how many of the prompt tokens of a chat completions request body this
// worker would serve from its cache if the request came now, and how many there are: what an
// oracle router knows and no real one does. It reads the cache without touching it.
func (w *Worker) CachedChatPrefix(body []byte) (cached, promptTokens int, err error) {
	var req chatRequest
	if err := decodeJSON(body, &req); err != nil {
		return 0, 0, err
	}
	model, _ := w.resolveModel(req.Model) // a model not served holds nothing here
	var seq prompt.Sequence
	if err := renderChatRequest(&seq, &req, true); err != nil {
		return 0, 0, err
	}
	bs := w.cfg.BlockSize
	hashes := kvcache.BlockHashes(nil, kvcache.Root(w.lora(model).name), seq.Text, seq.Ends, bs)
	maxHit := (seq.Len() - 1) / bs
	w.eng.mu.Lock()
	hit := min(w.eng.cache.Match(hashes), maxHit)
	w.eng.mu.Unlock()
	return hit * bs, seq.Len(), nil
}
