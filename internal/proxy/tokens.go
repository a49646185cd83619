package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/chatform"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// tokens.go asks an engine for a request's prompt tokens, as it will render them: vLLM's POST
// /tokenize with the chat's messages and tools and add_generation_prompt, or a completion's
// prompt, on the least loaded candidate or the render service (--tokenize-url). A policy that
// matches requests against the engines' KV-cache events needs them.
//
// It costs a round trip, so it is asked only where the events can decide, as the policy says
// (policy.Policy.WantsTokens): cache_aware wants a request without a session id or a previous
// response, and a session it has no first block for or whose worker's engine evicted it (the
// others follow their session); and only for the base model a worker lists first or a LoRA
// adapter the worker lists (its /v1/models "parent"), asked with the request's own model so that
// the engine renders it as it will serve it. An adapter's tokens go to the policy with the
// adapter's name (policy.Input.LoRA): engines key an adapter's blocks apart. The wait is bounded by
// --tokenize-timeout-secs plus --tokenize-timeout-per-kib-ms for each KiB asked (upstream.Timeouts.TokenizeFor),
// after which the request routes as it would without events. Answers are kept by route and
// history key, so a retried or repeated prompt is not tokenized twice.
//
// A chat is asked with its messages and tools as sent. A Responses or Messages body is asked as
// the chat vLLM converts it to (package chatform); one that cannot be converted exactly (images,
// reasoning, built-in tools ...) is not tokenized, and routes as without events.

// TokenizeOptions turn the asking on.
type TokenizeOptions struct {
	// CacheBytes bounds the remembered answers (their keys and tokens), all together.
	CacheBytes int
	// URL, when set, is the base URL of a render service asked in place of the least loaded
	// candidate (--tokenize-url).
	URL string
}

// maxTokenizeAnswer bounds the answer read from /tokenize.
const maxTokenizeAnswer = 8 << 20

// tokenCache remembers answers by model and history key, oldest forgotten first.
type tokenCache struct {
	mu     sync.Mutex
	budget int
	used   int
	byKey  map[string][]uint32
	order  []string
}

func (c *tokenCache) get(key string) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts, ok := c.byKey[key]
	return ts, ok
}

func (c *tokenCache) put(key string, ts []uint32) {
	size := len(key) + 4*len(ts)
	if size > c.budget/4 {
		return // one answer may not take over the cache
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[key]; ok {
		return
	}
	for c.used+size > c.budget && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		c.used -= len(old) + 4*len(c.byKey[old])
		delete(c.byKey, old)
	}
	c.byKey[key] = ts
	c.order = append(c.order, key)
	c.used += size
}

// addPromptTokens gives in the request's prompt tokens when they are worth asking for (else it
// leaves in.Tokens nil), with the LoRA adapter they are for ("" for a base model) and the
// request's cache_salt.
func (s *Server) addPromptTokens(rt *route, in *policy.Input, body []byte) {
	if s.tokenCache == nil || rt.tokenAsk == nil || in.Request.Text == "" ||
		len(in.Candidates) == 0 || !s.policy.WantsTokens(*in) {
		return
	}
	salt, ok := cacheSalt(body)
	if !ok {
		return // an engine refuses the request: it routes as without events, and is answered
	}
	in.Tokens, in.LoRA = s.promptTokens(rt, *in, body)
	if in.Tokens != nil {
		in.CacheSalt = salt
	}
}

// cacheSalt is the body's top-level cache_salt, "" without one; ok is false when it is not a
// string. vLLM folds the salt into a request's first block, so that requests of different salts
// never share cached blocks.
func cacheSalt(body []byte) (salt string, ok bool) {
	if !bytes.Contains(body, []byte(`"cache_salt"`)) {
		return "", true // inside a JSON string the name's quotes would be escaped
	}
	var b struct {
		CacheSalt *string `json:"cache_salt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false
	}
	if b.CacheSalt == nil {
		return "", true // the name stood in a nested object
	}
	return *b.CacheSalt, true
}

// promptTokens returns the request's prompt tokens, else nil, and the LoRA adapter they are for
// ("" for a base model).
func (s *Server) promptTokens(rt *route, in policy.Input, body []byte) ([]uint32, string) {
	req := in.Request
	w := in.Candidates[0]
	for _, c := range in.Candidates[1:] {
		if c.Load() < w.Load() {
			w = c
		}
	}
	model, lora, ok := tokenizeModel(w, req.Model)
	if !ok {
		return nil, ""
	}
	// The history keys of the three APIs share one framing, and their prompts may still render
	// apart (a Messages tool_use input is rewritten as Python writes JSON): the path keeps them apart.
	key := rt.path + "\x00" + model + "\x00" + req.Text
	if ts, ok := s.tokenCache.get(key); ok {
		s.metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeCached).Inc()
		return ts, lora
	}
	q, ok := rt.tokenAsk(body)
	if !ok {
		return nil, "" // not rendered exactly: routed as without events
	}
	start := time.Now()
	ts, err := s.tokenize(w, model, q)
	s.metrics.TokenizeDuration.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		s.metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeTimeout).Inc()
		return nil, ""
	case err != nil:
		s.metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeError).Inc()
		s.log.Debug("tokenize failed", "worker", w.Name(), "error", err)
		return nil, ""
	}
	s.metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeOK).Inc()
	s.tokenCache.put(key, ts)
	return ts, lora
}

// tokenizeModel is the model to ask w's /tokenize for a request for model, and the LoRA adapter
// the tokens are for: w's first base model for a request naming it or no model, the adapter
// itself for one of w's adapters. Any other model w lists (a second name without parent) is not
// asked: it routes by the prefix tree.
func tokenizeModel(w *workers.Worker, model string) (ask, lora string, ok bool) {
	models := w.Models()
	switch {
	case len(models) == 0:
		return "", "", false
	case model == "" || model == models[0]:
		return models[0], "", true
	}
	if _, ok := w.Adapter(model); ok {
		return model, model, true
	}
	return "", "", false
}

// tokenQuery is what /tokenize is asked for a request: a chat's messages and tools, or a
// completion's prompt.
type tokenQuery struct {
	Messages, Tools  json.RawMessage
	Prompt           *string
	AddSpecialTokens *bool // a completion's own add_special_tokens, passed on as it came
}

// tokenAsk turns a route's body into its /tokenize query; ok is false when the body does not
// render exactly as the query says, and is not tokenized.
type tokenAsk func(body []byte) (q tokenQuery, ok bool)

// chatTokenAsk takes a chat's messages and tools as sent.
func chatTokenAsk(body []byte) (tokenQuery, bool) {
	var chat struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools,omitempty"`
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		return tokenQuery{}, false
	}
	return tokenQuery{Messages: chat.Messages, Tools: chat.Tools}, true
}

// completionTokenAsk takes a completion's prompt when it is one string; a list of prompts (a
// batch) or of token ids is not asked.
func completionTokenAsk(body []byte) (tokenQuery, bool) {
	var c struct {
		Prompt           json.RawMessage `json:"prompt"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	var prompt string
	if json.Unmarshal(body, &c) != nil || json.Unmarshal(c.Prompt, &prompt) != nil {
		return tokenQuery{}, false
	}
	return tokenQuery{Prompt: &prompt, AddSpecialTokens: c.AddSpecialTokens}, true
}

// convertedTokenAsk takes the chat that convert renders a Responses or Messages body as
// (chatform), or refuses the body when convert cannot render it exactly.
func convertedTokenAsk(convert func([]byte) (*chatform.Chat, error)) tokenAsk {
	return func(body []byte) (tokenQuery, bool) {
		chat, err := convert(body)
		if err != nil {
			return tokenQuery{}, false
		}
		messages, tools, err := chat.Encode()
		return tokenQuery{Messages: messages, Tools: tools}, err == nil
	}
}

// tokenize asks the render service (--tokenize-url), else w, for the tokens of q.
func (s *Server) tokenize(w *workers.Worker, model string, q tokenQuery) ([]uint32, error) {
	base := w.URL()
	if s.opts.Tokenize != nil && s.opts.Tokenize.URL != "" {
		base = s.opts.Tokenize.URL
	}
	// Without HTML escaping: an engine reads the JSON either way, and one that renders the tools
	// as sent (the simulator) sees them as the client wrote them.
	var ask bytes.Buffer
	enc := json.NewEncoder(&ask)
	enc.SetEscapeHTML(false)
	var err error
	if q.Prompt != nil {
		err = enc.Encode(struct {
			Model            string `json:"model"`
			Prompt           string `json:"prompt"`
			AddSpecialTokens *bool  `json:"add_special_tokens,omitempty"`
		}{model, *q.Prompt, q.AddSpecialTokens})
	} else {
		err = enc.Encode(struct {
			Model               string          `json:"model"`
			Messages            json.RawMessage `json:"messages"`
			Tools               json.RawMessage `json:"tools,omitempty"`
			AddGenerationPrompt bool            `json:"add_generation_prompt"`
		}{model, q.Messages, q.Tools, true})
	}
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if t := s.opts.Upstream.Timeouts.TokenizeFor(ask.Len()); t > 0 {
		ctx, cancel = context.WithTimeout(ctx, t)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", &ask)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.workerClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/tokenize answered %d", resp.StatusCode)
	}
	var answer struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeAnswer)).Decode(&answer); err != nil {
		return nil, err
	}
	return answer.Tokens, nil
}
