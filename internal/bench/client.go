package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Response headers the bench reads. The router's names are also constants in internal/proxy;
// they are repeated here because any router or worker may set them, and the bench depends on
// the wire format, not on the router's code.
const (
	headerRouterWorker   = "x-vllm-router-worker"
	headerRouterDecision = "x-vllm-router-decision"
	headerSimWorker      = "x-sim-worker" // the simulator's own header, for targets without a router
	headerSessionID      = "x-session-id"
)

// Session id modes: how a request names its session.
const (
	SessionHeader = "header" // header x-session-id
	SessionBody   = "body"   // body "session_params": {"session_id": ...}
	SessionNone   = "none"   // not at all: routers must fall back to the conversation history
)

// SessionModes lists the accepted session id modes.
var SessionModes = []string{SessionHeader, SessionBody, SessionNone}

// Record is the outcome of one request.
type Record struct {
	Session, Turn int
	Start         time.Duration // from the start of the run, wall clock
	TTFT          time.Duration // to the first chunk that carries content, wall clock
	E2E           time.Duration // to the end of the stream, wall clock
	PromptTokens  int
	CachedTokens  int
	OutputTokens  int
	Worker        string // the router's x-vllm-router-worker, else the simulator's x-sim-worker
	Decision      string // x-vllm-router-decision
	Err           string // empty on success
	reply         string
}

// chatRequest is the body the bench sends.
type chatRequest struct {
	Model         string          `json:"model"`
	Messages      []Message       `json:"messages"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	MaxTokens     int             `json:"max_tokens"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	SessionParams *struct {
		SessionID string `json:"session_id"`
	} `json:"session_params,omitempty"`
}

// streamChunk is the part of an SSE chunk the bench reads.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// newHTTPClient returns a client for loopback or known targets: no environment proxy, enough
// idle connections for conns requests at once.
func newHTTPClient(conns int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4 * max(conns, 16),
			MaxIdleConnsPerHost: max(conns, 16),
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// maxErrorBody bounds how much of an error answer is kept.
const maxErrorBody = 512

// send posts one streaming chat request to base and fills rec with what came back. TTFT is
// measured at the first chunk with content (text, reasoning or a tool call), not at the
// headers, since a router or server may answer the headers before the first token.
func send(ctx context.Context, client *http.Client, base string, req *chatRequest, sessionID, mode string, rec *Record, began time.Time) {
	req.Stream = true
	req.StreamOptions.IncludeUsage = true
	req.SessionParams = nil
	if mode == SessionBody {
		req.SessionParams = &struct {
			SessionID string `json:"session_id"`
		}{sessionID}
	}
	body, err := json.Marshal(req)
	if err != nil {
		rec.Err = err.Error()
		return
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		rec.Err = err.Error()
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if mode == SessionHeader {
		hreq.Header.Set(headerSessionID, sessionID)
	}
	start := time.Now()
	rec.Start = start.Sub(began)
	resp, err := client.Do(hreq)
	if err != nil {
		rec.Err = shortError(err)
		return
	}
	defer resp.Body.Close()
	rec.Worker = resp.Header.Get(headerRouterWorker)
	if rec.Worker == "" {
		rec.Worker = resp.Header.Get(headerSimWorker)
	}
	rec.Decision = resp.Header.Get(headerRouterDecision)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		rec.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		return
	}
	var reply strings.Builder
	done := false
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A chunk longer than the buffer: read the rest of the line.
			rest, err2 := br.ReadBytes('\n')
			line, err = append(append([]byte(nil), line...), rest...), err2
		}
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if string(data) == "[DONE]" {
				done = true
				break
			}
			var ch streamChunk
			if jerr := json.Unmarshal(data, &ch); jerr != nil {
				rec.Err = "bad stream chunk: " + jerr.Error()
				return
			}
			for _, c := range ch.Choices {
				text := c.Delta.Content + c.Text
				if rec.TTFT == 0 && (text != "" || c.Delta.ReasoningContent != "" || len(c.Delta.ToolCalls) > 0) {
					rec.TTFT = time.Since(start)
				}
				reply.WriteString(text)
			}
			if u := ch.Usage; u != nil {
				rec.PromptTokens, rec.OutputTokens = u.PromptTokens, u.CompletionTokens
				if u.PromptTokensDetails != nil {
					rec.CachedTokens = u.PromptTokensDetails.CachedTokens
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				rec.Err = shortError(err)
				return
			}
			break
		}
	}
	rec.E2E = time.Since(start)
	switch {
	case !done:
		rec.Err = "stream ended without [DONE]"
	case rec.PromptTokens == 0:
		rec.Err = "no usage in the stream (stream_options.include_usage unsupported?)"
	case rec.TTFT == 0:
		rec.TTFT = rec.E2E // an empty reply: the first token is the end
	}
	rec.reply = reply.String()
}

// shortError strips the request URL and method that net/http puts in front of errors.
func shortError(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "\": "); i >= 0 {
		return s[i+3:]
	}
	return s
}

// discoverModel asks base for its models and returns the first.
func discoverModel(ctx context.Context, client *http.Client, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models: no model listed (give --model)", base)
	}
	return list.Data[0].ID, nil
}
