package routerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"

	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// LoRA adapters are loaded into and unloaded from every worker of a base model at once, so that
// the adapter is routable wherever the base model is: POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter are admin endpoints the router sends on to every healthy worker serving
// the body's "model" (the base model; every healthy worker when the body names none). The answer
// lists each worker's status and answer; it is 200 when every worker took the request, else 502.
// The workers that took it are probed at once, so their model lists (and so routing) include the
// adapter without waiting for the next health check.

// loraAnswerLimit bounds how much of each worker's answer is kept for the aggregate answer.
const loraAnswerLimit = 4 << 10

// loraResult is one worker's part of the aggregate answer.
type loraResult struct {
	Worker string          `json:"worker"`
	Status int             `json:"status,omitempty"`
	Answer json.RawMessage `json:"answer,omitempty"` // the worker's JSON answer, or its text as a JSON string
	Error  string          `json:"error,omitempty"`  // the request did not get an answer
}

func (a *API) lora(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, a.opts.MaxPayloadSize+1))
	if err != nil || int64(len(body)) > a.opts.MaxPayloadSize {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "the request body could not be read within --max-payload-size")
		return
	}
	var req struct {
		Model    string `json:"model"`
		LoraName string `json:"lora_name"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.LoraName == "" {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", `expected a JSON body with "lora_name" (and "lora_path" to load)`)
		return
	}
	candidates, _, known := a.opts.Pool.Candidates(req.Model)
	if !known || len(candidates) == 0 {
		w.Header().Set(proxy.HeaderRetryAfter, "1")
		proxy.WriteError(w, http.StatusServiceUnavailable, "server_error", "no_available_worker", "no healthy worker serves the base model")
		return
	}
	targets := map[string]*workers.Worker{} // one request per worker process, whatever its ranks
	for _, c := range candidates {
		if _, ok := targets[c.URL()]; !ok {
			targets[c.URL()] = c
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.opts.Upstream.Timeouts.Request)
	defer cancel()
	results := make([]loraResult, 0, len(targets))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for url, wk := range targets {
		wg.Go(func() {
			res := a.sendLora(ctx, url+r.URL.Path, body)
			res.Worker = wk.BaseName()
			if res.Status/100 == 2 && a.opts.Fleet != nil {
				a.opts.Fleet.CheckWorker(ctx, url)
			}
			mu.Lock()
			results = append(results, res)
			mu.Unlock()
		})
	}
	wg.Wait()
	status := http.StatusOK
	for _, res := range results {
		if res.Status/100 != 2 {
			status = http.StatusBadGateway
		}
	}
	writeJSON(w, status, map[string]any{"results": results})
}

// sendLora posts body to one worker with the worker's credential (workerClient), never the
// admin's key.
func (a *API) sendLora(ctx context.Context, url string, body []byte) loraResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return loraResult{Error: "the worker's URL is not usable"}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return loraResult{Error: "the worker could not be reached"}
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, loraAnswerLimit))
	res := loraResult{Status: resp.StatusCode}
	if json.Valid(answer) {
		res.Answer = answer
	} else {
		res.Answer, _ = json.Marshal(string(answer))
	}
	return res
}
