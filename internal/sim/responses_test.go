package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestResponses_StoredChainGrowsCachedTokens(t *testing.T) {
	w := newWorker(t, testConfig())
	rs := collect(w)
	r := createResponse(t, w, map[string]any{
		"model": "sim-model", "instructions": "You are terse.", "input": words("q0", 600),
		"max_output_tokens": 24, "ignore_eos": true,
	})
	if r.Object != "response" || r.Status != "completed" || !strings.HasPrefix(r.ID, "resp_") || !r.Store {
		t.Fatalf("response %+v", r)
	}
	if r.Usage.InputTokensDetails.CachedTokens != 0 || r.Usage.OutputTokens != 24 ||
		r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Fatalf("turn 0 usage %+v", r.Usage)
	}
	for turn := 1; turn <= 4; turn++ {
		prev := r
		r = createResponse(t, w, map[string]any{
			"instructions": "You are terse.", "input": fmt.Sprintf("and now step %d", turn),
			"previous_response_id": prev.ID, "max_output_tokens": 24, "ignore_eos": true,
		})
		if r.PreviousResponseID == nil || *r.PreviousResponseID != prev.ID {
			t.Fatalf("turn %d: previous_response_id %v, want %s", turn, r.PreviousResponseID, prev.ID)
		}
		// The previous turn left its prompt and its reply in the cache.
		left := prev.Usage.InputTokens + prev.Usage.OutputTokens + 3 // + "<|end|>\n"
		if got, want := r.Usage.InputTokensDetails.CachedTokens, left/16*16; got != want {
			t.Fatalf("turn %d: cached %d of %d, want every full block of the previous prompt and reply (%d)",
				turn, got, r.Usage.InputTokens, want)
		}
		if r.Usage.InputTokens <= left {
			t.Fatalf("turn %d: prompt %d tokens does not hold the previous prompt and reply (%d)", turn, r.Usage.InputTokens, left)
		}
	}
	// Every turn counted as chat turns do.
	all := rs.list()
	if len(all) != 5 || all[4].CachedTokens != r.Usage.InputTokensDetails.CachedTokens || all[4].PromptTokens != r.Usage.InputTokens {
		t.Fatalf("results %+v, last usage %+v", all, r.Usage)
	}
	if s := w.Stats(); s.StoredResponses != 5 || s.CachedTokens == 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestResponses_UnknownPreviousResponseIDIs404InVLLMShape(t *testing.T) {
	w := newWorker(t, testConfig())
	rec := do(t, w, "POST", "/v1/responses", `{"model":"sim-model","input":"hi","previous_response_id":"resp_0123abc"}`)
	want := `{"error":{"message":"Response with id 'resp_0123abc' not found.","type":"invalid_request_error","param":null,"code":404}}`
	if rec.Code != http.StatusNotFound || rec.Body.String() != want {
		t.Fatalf("status %d body %s\nwant 404 %s", rec.Code, rec.Body, want)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	if s := w.Stats(); s.Requests != 0 || s.Rejected != 1 {
		t.Fatalf("stats %+v: the turn must be refused before it runs", s)
	}
}

func TestResponses_StoreFalseIsNotStored(t *testing.T) {
	w := newWorker(t, testConfig())
	r := createResponse(t, w, `{"input":"hello","store":false,"max_output_tokens":4}`)
	if r.Store {
		t.Fatal("store:false answered store true")
	}
	if rec := do(t, w, "GET", "/v1/responses/"+r.ID, ""); rec.Code != 404 {
		t.Fatalf("GET of an unstored response: %d %s", rec.Code, rec.Body)
	}
	rec := do(t, w, "POST", "/v1/responses", `{"input":"more","previous_response_id":"`+r.ID+`"}`)
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), "Response with id '"+r.ID+"' not found.") {
		t.Fatalf("continuing an unstored response: %d %s", rec.Code, rec.Body)
	}
	if n := w.Stats().StoredResponses; n != 0 {
		t.Fatalf("%d stored responses, want 0", n)
	}
}

func TestResponses_GetDeleteCancelInputItems(t *testing.T) {
	w := newWorker(t, testConfig())
	first := createResponse(t, w, `{"input":"hello","max_output_tokens":4}`)
	r := createResponse(t, w, map[string]any{
		"previous_response_id": first.ID, "max_output_tokens": 4,
		"input": []any{
			map[string]any{"role": "user", "content": "one"},
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "two"}}},
			map[string]any{"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
			map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "done"},
		},
	})

	rec := do(t, w, "GET", "/v1/responses/"+r.ID, "")
	var got respReply
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body)
	}
	if got.ID != r.ID || got.text() != r.text() || got.Usage != r.Usage || got.Status != "completed" {
		t.Fatalf("GET returned %+v, want %+v", got, r)
	}

	type itemList struct {
		Object  string `json:"object"`
		Data    []map[string]any
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
		HasMore bool   `json:"has_more"`
	}
	list := func(query string) itemList {
		t.Helper()
		rec := do(t, w, "GET", "/v1/responses/"+r.ID+"/input_items"+query, "")
		var l itemList
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || rec.Code != 200 || l.Object != "list" {
			t.Fatalf("input_items%s: %d %s", query, rec.Code, rec.Body)
		}
		return l
	}
	desc := list("")
	if len(desc.Data) != 4 || desc.HasMore {
		t.Fatalf("input items %+v, want the response's own 4 items", desc)
	}
	if desc.Data[0]["type"] != "function_call_output" || desc.Data[3]["type"] != "message" || desc.Data[3]["status"] != "completed" {
		t.Fatalf("default order is not newest first: %+v", desc.Data)
	}
	for _, it := range desc.Data {
		if id, _ := it["id"].(string); id == "" {
			t.Fatalf("item without id: %+v", it)
		}
	}
	asc := list("?order=asc&limit=2")
	if len(asc.Data) != 2 || !asc.HasMore || asc.Data[0]["id"] != desc.Data[3]["id"] || asc.FirstID != asc.Data[0]["id"] || asc.LastID != asc.Data[1]["id"] {
		t.Fatalf("asc page %+v", asc)
	}
	rest := list("?order=asc&after=" + asc.LastID)
	if len(rest.Data) != 2 || rest.HasMore || rest.Data[1]["id"] != desc.Data[0]["id"] {
		t.Fatalf("page after %s: %+v", asc.LastID, rest)
	}
	if again := list(""); again.Data[0]["id"] != desc.Data[0]["id"] {
		t.Fatal("item ids change between listings")
	}
	if first := do(t, w, "GET", "/v1/responses/"+first.ID+"/input_items", ""); !strings.Contains(first.Body.String(), `"text":"hello"`) {
		t.Fatalf("a string input lists as a message item: %s", first.Body)
	}

	// vLLM cancels only background responses still running: a stored,
	// completed one gets 400.
	rec = do(t, w, "POST", "/v1/responses/"+r.ID+"/cancel", "")
	if want := `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":null,"code":400}}`; rec.Code != 400 || rec.Body.String() != want {
		t.Fatalf("cancel: %d %s", rec.Code, rec.Body)
	}

	rec = do(t, w, "DELETE", "/v1/responses/"+r.ID, "")
	if want := `{"id":"` + r.ID + `","object":"response","deleted":true}`; rec.Code != 200 || rec.Body.String() != want {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	for _, req := range []struct{ method, path string }{
		{"GET", "/v1/responses/" + r.ID},
		{"DELETE", "/v1/responses/" + r.ID},
		{"POST", "/v1/responses/" + r.ID + "/cancel"},
		{"GET", "/v1/responses/" + r.ID + "/input_items"},
	} {
		rec := do(t, w, req.method, req.path, "")
		want := `{"error":{"message":"Response with id '` + r.ID + `' not found.","type":"invalid_request_error","param":null,"code":404}}`
		if rec.Code != 404 || rec.Body.String() != want {
			t.Fatalf("%s %s after delete: %d %s", req.method, req.path, rec.Code, rec.Body)
		}
	}
	if rec := do(t, w, "POST", "/v1/responses", `{"input":"x","previous_response_id":"`+r.ID+`"}`); rec.Code != 404 {
		t.Fatalf("continuing a deleted response: %d", rec.Code)
	}
}

func TestResponses_StoreForgetsLeastRecentlyUsedPastItsBound(t *testing.T) {
	w := newWorker(t, testConfig())
	w.stored.maxEntries = 3
	var ids []string
	for i := range 3 {
		ids = append(ids, createResponse(t, w, fmt.Sprintf(`{"input":"q%d","max_output_tokens":2}`, i)).ID)
	}
	do(t, w, "GET", "/v1/responses/"+ids[0], "") // ids[0] is now more recent than ids[1]
	ids = append(ids, createResponse(t, w, `{"input":"q3","max_output_tokens":2}`).ID)
	for i, want := range []int{200, 404, 200, 200} {
		if rec := do(t, w, "GET", "/v1/responses/"+ids[i], ""); rec.Code != want {
			t.Fatalf("response %d: %d, want %d", i, rec.Code, want)
		}
	}
	if n := w.Stats().StoredResponses; n != 3 {
		t.Fatalf("%d stored, want 3", n)
	}

	// The byte bound: a response larger than the whole budget is not kept.
	w.stored.maxBytes = 1000
	big := createResponse(t, w, map[string]any{"input": words("big", 2000), "max_output_tokens": 2})
	if rec := do(t, w, "GET", "/v1/responses/"+big.ID, ""); rec.Code != 404 {
		t.Fatalf("a response over the byte budget was kept: %d", rec.Code)
	}
}

func TestResponses_StreamEventOrderAndUsage(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TimeScale = 0.001 // paced, so events are flushed as they come
	w, url := startOne(t, cfg)
	rs := collect(w)
	resp := post(t, url+"/v1/responses", `{"model":"sim-model","input":"stream please","max_output_tokens":6,"ignore_eos":true,"stream":true}`)
	storedAtCompletion := -1
	events := readEvents(t, resp, func(e namedEvent) {
		if e.name == "response.completed" {
			// A client continues from the response as soon as it completes.
			storedAtCompletion = do(t, w, "GET", "/v1/responses/"+jsonID(t, e.data), "").Code
		}
	})
	if storedAtCompletion != 200 {
		t.Fatalf("GET at response.completed: %d, want the response stored before its last event", storedAtCompletion)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range 6 {
		want = append(want, "response.output_text.delta")
	}
	want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
	if got := eventNames(events); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
	var text strings.Builder
	var itemID string
	for i, e := range events {
		var ev struct {
			SequenceNumber *int       `json:"sequence_number"`
			Response       *respReply `json:"response"`
			ItemID         string     `json:"item_id"`
			Delta          string     `json:"delta"`
			Text           string     `json:"text"`
			Item           *struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"item"`
		}
		if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.SequenceNumber == nil || *ev.SequenceNumber != i {
			t.Fatalf("event %d (%s) has sequence_number %v", i, e.name, ev.SequenceNumber)
		}
		switch e.name {
		case "response.created", "response.in_progress":
			if r := ev.Response; r == nil || !strings.HasPrefix(r.ID, "resp_") || r.Status != "in_progress" || len(r.Output) != 0 {
				t.Fatalf("%s: %s", e.name, e.data)
			}
		case "response.output_item.added":
			itemID = ev.Item.ID
			if ev.Item.Status != "in_progress" || !strings.HasPrefix(itemID, "msg_") {
				t.Fatalf("%s: %s", e.name, e.data)
			}
		case "response.output_text.delta":
			if ev.ItemID != itemID {
				t.Fatalf("delta of item %q, want %q", ev.ItemID, itemID)
			}
			text.WriteString(ev.Delta)
		case "response.output_text.done":
			if ev.Text != text.String() {
				t.Fatalf("done text %q, deltas %q", ev.Text, text.String())
			}
		case "response.completed":
			r := ev.Response
			if r.Status != "completed" || r.text() != text.String() || r.Output[0].ID != itemID || r.ID != events0ID(t, events) {
				t.Fatalf("completed: %s", e.data)
			}
			res := rs.list()[0]
			if r.Usage.InputTokens != res.PromptTokens || r.Usage.OutputTokens != 6 || r.Usage.InputTokensDetails.CachedTokens != res.CachedTokens ||
				r.Usage.TotalTokens != res.PromptTokens+6 {
				t.Fatalf("usage %+v, result %+v", r.Usage, res)
			}
		}
	}
}

// jsonID returns the response id of an event that carries a response.
func jsonID(t *testing.T, data string) string {
	var ev struct {
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Response.ID
}

// events0ID returns the response id response.created announced.
func events0ID(t *testing.T, events []namedEvent) string {
	var ev struct {
		Response struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(events[0].data), &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Response.ID
}

func TestResponses_StreamedFunctionCall(t *testing.T) {
	_, url := startOne(t, testConfig())
	body := jsonBody(t, map[string]any{"input": "weather in Paris?", "tools": []any{responsesWeatherTool()},
		"max_output_tokens": 64, "stream": true})
	events := namedEvents(t, post(t, url+"/v1/responses", body))
	names := eventNames(events)
	n := len(names)
	if n < 7 || names[2] != "response.output_item.added" || names[3] != "response.function_call_arguments.delta" ||
		names[n-3] != "response.function_call_arguments.done" || names[n-2] != "response.output_item.done" || names[n-1] != "response.completed" {
		t.Fatalf("events %v", names)
	}
	var args strings.Builder
	for _, e := range events[3 : n-3] {
		var ev struct {
			Delta string `json:"delta"`
		}
		json.Unmarshal([]byte(e.data), &ev)
		if e.name != "response.function_call_arguments.delta" || ev.Delta == "" {
			t.Fatalf("event %s %s", e.name, e.data)
		}
		args.WriteString(ev.Delta)
	}
	var added, done struct {
		Item struct {
			Type, ID, Name, Arguments, Status string
			CallID                            string `json:"call_id"`
		} `json:"item"`
	}
	json.Unmarshal([]byte(events[2].data), &added)
	json.Unmarshal([]byte(events[n-2].data), &done)
	if added.Item.Type != "function_call" || added.Item.Status != "in_progress" || added.Item.Arguments != "" || added.Item.Name != "get_weather" {
		t.Fatalf("added %+v", added.Item)
	}
	if done.Item.Arguments != args.String() || done.Item.CallID != added.Item.CallID || done.Item.Status != "completed" ||
		!strings.HasPrefix(done.Item.CallID, "call_") || !strings.HasPrefix(done.Item.ID, "fc_") {
		t.Fatalf("done %+v, streamed arguments %q", done.Item, args.String())
	}
	if !json.Valid([]byte(args.String())) {
		t.Fatalf("arguments %q are not JSON", args.String())
	}
}

func TestResponses_ToolCallRule(t *testing.T) {
	w := newWorker(t, testConfig())
	tools := []any{responsesWeatherTool(), map[string]any{"type": "function", "name": "noop"}, map[string]any{"type": "web_search"}}
	ask := func(extra map[string]any, input ...any) respReply {
		t.Helper()
		body := map[string]any{"input": input, "tools": tools, "max_output_tokens": 64}
		for k, v := range extra {
			body[k] = v
		}
		return createResponse(t, w, body)
	}
	user := map[string]any{"role": "user", "content": "weather in Paris?"}

	r := ask(nil, user)
	if len(r.Output) != 1 || r.Output[0].Type != "function_call" || r.Output[0].Name != "get_weather" {
		t.Fatalf("a user message with tools offered: %+v, want a call of the first tool", r.Output)
	}
	if want := `{"city": "`; !strings.HasPrefix(r.Output[0].Arguments, want) || !strings.HasSuffix(r.Output[0].Arguments, `", "unit": "celsius"}`) {
		t.Fatalf("arguments %s: want the required parameters in sorted order, the enum's first value", r.Output[0].Arguments)
	}
	if again := ask(nil, user); again.Output[0].Arguments != r.Output[0].Arguments {
		t.Fatal("the same turn called with other arguments")
	}
	call := map[string]any{"type": "function_call", "call_id": r.Output[0].CallID, "name": "get_weather", "arguments": r.Output[0].Arguments}
	result := map[string]any{"type": "function_call_output", "call_id": r.Output[0].CallID, "output": "sunny"}
	if r := ask(nil, user, call, result); r.Output[0].Type != "message" || r.text() == "" {
		t.Fatalf("the turn that brings the result: %+v, want text", r.Output)
	}
	// The next user message calls the next tool.
	if r := ask(nil, user, call, result, map[string]any{"role": "user", "content": "and tomorrow?"}); r.Output[0].Name != "noop" || r.Output[0].Arguments != "{}" {
		t.Fatalf("second call %+v, want noop({})", r.Output[0])
	}
	if r := ask(map[string]any{"tool_choice": "none"}, user); r.Output[0].Type != "message" {
		t.Fatalf("tool_choice none: %+v", r.Output)
	}
	if r := ask(map[string]any{"tool_choice": map[string]any{"type": "function", "name": "noop"}}, user); r.Output[0].Name != "noop" {
		t.Fatalf("named tool_choice: %+v", r.Output)
	}
	if r := ask(map[string]any{"max_output_tokens": 3}, user); r.Output[0].Type != "message" || r.Usage.OutputTokens > 3 {
		t.Fatalf("a call that does not fit in max_output_tokens: %+v", r.Output)
	}
	if r := createResponse(t, w, map[string]any{"input": "hi", "max_output_tokens": 64}); r.Output[0].Type != "message" {
		t.Fatalf("no tools: %+v", r.Output)
	}
}

func TestResponses_ToolCallReplyIsCachedForTheNextTurn(t *testing.T) {
	w := newWorker(t, testConfig())
	tools := []any{responsesWeatherTool()}
	user := map[string]any{"role": "user", "content": words("w", 300)}
	r1 := createResponse(t, w, map[string]any{"input": []any{user}, "tools": tools, "max_output_tokens": 64, "store": false})
	c := r1.Output[0]
	if c.Type != "function_call" {
		t.Fatalf("no call: %+v", r1.Output)
	}
	// Full resend: the call as the client echoes it, then its result.
	r2 := createResponse(t, w, map[string]any{"tools": tools, "max_output_tokens": 8, "input": []any{user,
		map[string]any{"type": "function_call", "call_id": c.CallID, "name": c.Name, "arguments": c.Arguments},
		map[string]any{"type": "function_call_output", "call_id": c.CallID, "output": "sunny"}}})
	left := r1.Usage.InputTokens + r1.Usage.OutputTokens + 3
	if got := r2.Usage.InputTokensDetails.CachedTokens; got != left/16*16 {
		t.Fatalf("cached %d after a call of %d tokens on a %d-token prompt, want %d: the call was not cached as the next turn renders it",
			got, r1.Usage.OutputTokens, r1.Usage.InputTokens, left/16*16)
	}
}

func TestResponses_InstructionsAreNotCarriedOver(t *testing.T) {
	w := newWorker(t, testConfig())
	r1 := createResponse(t, w, `{"instructions":"`+words("sys", 200)+`","input":"hi","max_output_tokens":4}`)
	with := createResponse(t, w, `{"instructions":"`+words("sys", 200)+`","input":"again","previous_response_id":"`+r1.ID+`","max_output_tokens":4}`)
	without := createResponse(t, w, `{"input":"again","previous_response_id":"`+r1.ID+`","max_output_tokens":4}`)
	if with.Usage.InputTokens-without.Usage.InputTokens < 40 {
		t.Fatalf("prompt %d with instructions, %d without: the previous turn's instructions were carried over",
			with.Usage.InputTokens, without.Usage.InputTokens)
	}
	if with.Usage.InputTokensDetails.CachedTokens < r1.Usage.InputTokens/16*16 {
		t.Fatalf("resending the same instructions cached %d of the previous %d prompt tokens",
			with.Usage.InputTokensDetails.CachedTokens, r1.Usage.InputTokens)
	}
}

func TestResponses_BadRequests(t *testing.T) {
	w := checkRefusals(t, "/v1/responses", []refusal{
		{"malformed JSON", `{"input":`, 400, "BadRequestError", "JSON"},
		{"missing input", `{"model":"sim-model"}`, 400, "BadRequestError", "input: field required"},
		{"input not a list", `{"input":5}`, 400, "BadRequestError", "input"},
		{"empty input", `{"input":[]}`, 400, "BadRequestError", "at least one"},
		{"bad role", `{"input":[{"role":"robot","content":"x"}]}`, 400, "BadRequestError", "input[0].role"},
		{"function call without name", `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, 400, "BadRequestError", "input[0].name"},
		{"output without call id", `{"input":[{"type":"function_call_output","output":"x"}]}`, 400, "BadRequestError", "input[0].call_id"},
		{"max_output_tokens zero", `{"input":"x","max_output_tokens":0}`, 400, "BadRequestError", "max_output_tokens"},
		{"tools not a list", `{"input":"x","tools":{}}`, 400, "BadRequestError", "tools"},
		{"bad tool_choice", `{"input":"x","tool_choice":"sometimes"}`, 400, "BadRequestError", "tool_choice"},
		{"prompt too long", `{"input":"` + strings.Repeat("word ", 1200) + `"}`, 400, "invalid_request_error", "exceeds the max_model_len 1000"},
		{"unknown model", `{"model":"gpt-9","input":"x"}`, 404, "NotFoundError", "gpt-9"},
	}, func(t *testing.T, rec *httptest.ResponseRecorder, r refusal) {
		var e struct {
			Error *errorInfo `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == nil {
			t.Fatalf("body %s (%v)", rec.Body, err)
		}
		if rec.Code != r.code || e.Error.Code != r.code || e.Error.Type != r.typ || e.Error.Param != nil || !strings.Contains(e.Error.Message, r.msg) {
			t.Fatalf("status %d body %s, want %d %s mentioning %q", rec.Code, rec.Body, r.code, r.typ, r.msg)
		}
	})
	if rec := do(t, w, "GET", "/v1/responses/x/input_items?limit=0", ""); rec.Code != 404 {
		t.Fatalf("input_items of an unknown id: %d", rec.Code)
	}
	id := createResponse(t, w, `{"input":"x","max_output_tokens":1}`).ID
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?order=up"} {
		if rec := do(t, w, "GET", "/v1/responses/"+id+"/input_items"+q, ""); rec.Code != 400 {
			t.Fatalf("input_items%s: %d", q, rec.Code)
		}
	}
}

func TestResponses_Fault500InOpenAIShape(t *testing.T) {
	fleet := faultyFleet(t, FailHTTP500, testConfig())
	resp := post(t, fleet.URLs()[0]+"/v1/responses", `{"input":"x"}`)
	var e struct {
		Error errorInfo `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != 500 || e.Error.Code != 500 || e.Error.Message != "simulated failure" {
		t.Fatalf("status %d body %+v", resp.StatusCode, e)
	}
	if n := fleet.Workers()[0].Stats().StoredResponses; n != 0 {
		t.Fatalf("a failed response was stored (%d)", n)
	}
}

func TestResponses_ContentPartsRenderAsChatParts(t *testing.T) {
	w := newWorker(t, testConfig())
	text := words("p", 400)
	r1 := createResponse(t, w, map[string]any{"max_output_tokens": 1, "input": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "input_text", "text": text},
		map[string]any{"type": "input_image", "image_url": "https://x/y.png"},
	}}}})
	c := chat(t, w, []msg{{"user", text + "<|image|>https://x/y.png"}}, 1)
	if c.Usage.PromptTokens != r1.Usage.InputTokens || c.Usage.PromptTokensDetails.CachedTokens < (r1.Usage.InputTokens-1)/16*16 {
		t.Fatalf("chat prompt %d cached %d; responses prompt %d", c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens, r1.Usage.InputTokens)
	}
}

func TestResponses_ConcurrentChainsKeepTheirOwnConversations(t *testing.T) {
	w, url := startOne(t, testConfig())
	const chains, turns = 6, 4
	errs := make(chan error, chains)
	for c := range chains {
		go func() {
			prev, prevLeft := "", 0
			for turn := range turns {
				body := fmt.Sprintf(`{"input":"chain %d turn %d %s","max_output_tokens":8,"ignore_eos":true`, c, turn, words("c", 100))
				if prev != "" {
					body += `,"previous_response_id":"` + prev + `"`
				}
				resp, err := http.Post(url+"/v1/responses", "application/json", strings.NewReader(body+"}"))
				if err != nil {
					errs <- err
					return
				}
				var r respReply
				err = json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					errs <- fmt.Errorf("chain %d turn %d: %d %v", c, turn, resp.StatusCode, err)
					return
				}
				if turn > 0 && r.Usage.InputTokensDetails.CachedTokens != prevLeft/16*16 {
					errs <- fmt.Errorf("chain %d turn %d: cached %d, want %d", c, turn, r.Usage.InputTokensDetails.CachedTokens, prevLeft/16*16)
					return
				}
				prev, prevLeft = r.ID, r.Usage.InputTokens+r.Usage.OutputTokens+3
			}
			errs <- nil
		}()
	}
	for range chains {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := w.Stats().StoredResponses; n != chains*turns {
		t.Fatalf("%d stored, want %d", n, chains*turns)
	}
}

func TestResponses_ClientLeavingMidStreamStoresNothing(t *testing.T) {
	cfg, clock := clockedConfig()
	w, url := startOne(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/responses", strings.NewReader(`{"input":"hi","max_output_tokens":4,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "event: response.created\n" {
		t.Fatalf("first line %q (%v): response.created goes out before the prefill", line, err)
	}
	testkit.WaitFor(t, "prefill", func() bool { return clock.Sleepers() == 1 })
	cancel()
	testkit.WaitFor(t, "the request to end", func() bool { s := w.Stats(); return s.Canceled == 1 && s.Running == 0 })
	if s := w.Stats(); s.StoredResponses != 0 || s.PinnedBlocks != 0 {
		t.Fatalf("stats after the client left: %+v", s)
	}
}
