package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
)

// loraConfig is testConfig serving the base model with adapters sql and chat.
func loraConfig() Config {
	cfg := testConfig()
	cfg.LoRAModules = []LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat"}}
	return cfg
}

type modelCard struct {
	ID          string  `json:"id"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func listModels(t *testing.T, w *Worker) []modelCard {
	t.Helper()
	rec := do(t, w, http.MethodGet, "/v1/models", "")
	var list struct{ Data []modelCard }
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		t.Fatalf("/v1/models: %d %s", rec.Code, rec.Body)
	}
	return list.Data
}

// chatModel sends msgs for model and returns its reply.
func chatModel(t *testing.T, w *Worker, model string, msgs []msg) chatReply {
	t.Helper()
	return chatWith(t, w, map[string]any{"model": model, "messages": msgs, "max_tokens": 4, "ignore_eos": true})
}

func TestLoRA_ModelsListsEachAdapterWithItsParentAndPath(t *testing.T) {
	w := newWorker(t, loraConfig())
	got := listModels(t, w)
	if len(got) != 3 || got[0].ID != "sim-model" || got[0].Parent != nil || got[0].MaxModelLen == nil {
		t.Fatalf("models %+v: want the base model first, without parent", got)
	}
	for i, want := range []struct{ id, root string }{{"sql", "/adapters/sql"}, {"chat", "/adapters/chat"}} {
		c := got[i+1]
		if c.ID != want.id || c.Root != want.root || c.Parent == nil || *c.Parent != "sim-model" || c.MaxModelLen != nil {
			t.Fatalf("adapter %d = %+v, want %s with root %s and parent sim-model", i, c, want.id, want.root)
		}
	}
}

func TestLoRA_AnAdapterOfAnotherBaseModelNamesItAsParent(t *testing.T) {
	cfg := testConfig()
	cfg.Models = []string{"llama", "qwen"}
	m, err := ParseLoRAModule(`{"name": "qwen-sql", "path": "/a/qs", "base_model_name": "qwen"}`)
	if err != nil {
		t.Fatal(err)
	}
	cfg.LoRAModules = []LoRAModule{m}
	got := listModels(t, newWorker(t, cfg))
	if len(got) != 3 || got[2].ID != "qwen-sql" || got[2].Parent == nil || *got[2].Parent != "qwen" || got[2].Root != "/a/qs" {
		t.Fatalf("models %+v", got)
	}
}

func TestLoRA_ParseLoRAModuleReadsBothOfVLLMsForms(t *testing.T) {
	for in, want := range map[string]LoRAModule{
		"sql=/adapters/sql":                                    {Name: "sql", Path: "/adapters/sql"},
		`{"name":"sql","path":"/a=b"}`:                         {Name: "sql", Path: "/a=b"},
		`{"name":"sql","path":"/a","base_model_name":"llama"}`: {Name: "sql", Path: "/a", Base: "llama"},
	} {
		got, err := ParseLoRAModule(in)
		if err != nil || got != want {
			t.Fatalf("%s: %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"sql", "=path", "sql=", "a=b,c=d", `{"name":"sql"}`, `{"name":"s","path":"p","rank":8}`} {
		if _, err := ParseLoRAModule(bad); err == nil {
			t.Fatalf("%q was accepted", bad)
		}
	}
}

func TestLoRA_ConfigRefusesAdaptersThatClashOrExceedTheBound(t *testing.T) {
	for name, mods := range map[string][]LoRAModule{
		"named as the base model": {{Name: "sim-model", Path: "/a"}},
		"given twice":             {{Name: "a", Path: "/a"}, {Name: "a", Path: "/b"}},
		"of a model not served":   {{Name: "a", Path: "/a", Base: "other"}},
		"past max loras":          {{Name: "a", Path: "/a"}, {Name: "b", Path: "/b"}, {Name: "c", Path: "/c"}},
	} {
		cfg := testConfig()
		cfg.MaxLoRAs = 2
		cfg.LoRAModules = mods
		if err := cfg.Validate(); err == nil {
			t.Fatalf("adapters %s were accepted", name)
		}
	}
}

// postLoRA sends body to path and returns the status, the content type and the body.
func postLoRA(t *testing.T, w *Worker, path, body string) (int, string, string) {
	t.Helper()
	rec := do(t, w, http.MethodPost, path, body)
	return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
}

func errorType(t *testing.T, body string) string {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Object != "error" {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Type
}

func TestLoRA_AdaptersAreLoadedAndUnloadedAtRunTime(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := []msg{{"user", "hello"}}
	if rec := do(t, w, http.MethodPost, "/v1/chat/completions", `{"model":"new","messages":[{"role":"user","content":"hi"}]}`); rec.Code != http.StatusNotFound {
		t.Fatalf("a request for an adapter not loaded: %d", rec.Code)
	}

	code, ctype, body := postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/adapters/new"}`)
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") || body != "Success: LoRA adapter 'new' added successfully." {
		t.Fatalf("load: %d %s %q", code, ctype, body)
	}
	if got := listModels(t, w); len(got) != 2 || got[1].ID != "new" || got[1].Root != "/adapters/new" {
		t.Fatalf("models after load: %+v", got)
	}
	chatModel(t, w, "new", msgs)

	code, _, body = postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/elsewhere"}`)
	if code != http.StatusBadRequest || errorType(t, body) != "InvalidUserInput" || !strings.Contains(body, "already been loaded") {
		t.Fatalf("loading it again: %d %s", code, body)
	}
	if code, _, body = postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"x"}`); code != http.StatusBadRequest || errorType(t, body) != "InvalidUserInput" {
		t.Fatalf("a load without path: %d %s", code, body)
	}
	if code, _, body = postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"sim-model","lora_path":"/p"}`); code != http.StatusBadRequest {
		t.Fatalf("an adapter named as the base model: %d %s", code, body)
	}

	code, ctype, body = postLoRA(t, w, "/v1/unload_lora_adapter", `{"lora_name":"new"}`)
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") || body != "Success: LoRA adapter 'new' removed successfully." {
		t.Fatalf("unload: %d %s %q", code, ctype, body)
	}
	if got := listModels(t, w); len(got) != 1 {
		t.Fatalf("models after unload: %+v", got)
	}
	if rec := do(t, w, http.MethodPost, "/v1/chat/completions", `{"model":"new","messages":[{"role":"user","content":"hi"}]}`); rec.Code != http.StatusNotFound {
		t.Fatalf("a request for an unloaded adapter: %d", rec.Code)
	}
	code, _, body = postLoRA(t, w, "/v1/unload_lora_adapter", `{"lora_name":"new"}`)
	if code != http.StatusNotFound || errorType(t, body) != "NotFoundError" || !strings.Contains(body, "cannot be found") {
		t.Fatalf("unloading it again: %d %s", code, body)
	}
	if code, _, body = postLoRA(t, w, "/v1/unload_lora_adapter", `{}`); code != http.StatusBadRequest || errorType(t, body) != "InvalidUserInput" {
		t.Fatalf("an unload without name: %d %s", code, body)
	}
}

func TestLoRA_ALoadPastMaxLoRAsIsRefusedUntilOneIsUnloaded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxLoRAs = 1
	cfg.LoRAModules = []LoRAModule{{Name: "sql", Path: "/adapters/sql"}}
	w := newWorker(t, cfg)
	code, _, body := postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"more","lora_path":"/adapters/more"}`)
	if code != http.StatusBadRequest || errorType(t, body) != "BadRequestError" || !strings.Contains(body, "--max-loras") {
		t.Fatalf("a load past the bound: %d %s", code, body)
	}
	if code, _, body = postLoRA(t, w, "/v1/unload_lora_adapter", `{"lora_name":"sql"}`); code != http.StatusOK {
		t.Fatalf("unload: %d %s", code, body)
	}
	if code, _, body = postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"more","lora_path":"/adapters/more"}`); code != http.StatusOK {
		t.Fatalf("a load after an unload: %d %s", code, body)
	}
}

// TestLoRA_AnAdaptersBlocksServeOnlyThatAdapter: one prompt served for the base model, then for
// each adapter, is cached apart each time; each again hits only its own blocks.
func TestLoRA_AnAdaptersBlocksServeOnlyThatAdapter(t *testing.T) {
	w := newWorker(t, loraConfig())
	msgs := []msg{{"user", words("Explain the schema.", 400)}}
	for _, model := range []string{"sim-model", "sql", "chat"} {
		if r := chatModel(t, w, model, msgs); r.Usage.PromptTokensDetails.CachedTokens != 0 {
			t.Fatalf("%s's first request found %d cached tokens of another model's", model, r.Usage.PromptTokensDetails.CachedTokens)
		}
	}
	for _, model := range []string{"chat", "sim-model", "sql"} {
		if r := chatModel(t, w, model, msgs); r.Usage.PromptTokensDetails.CachedTokens < 64 {
			t.Fatalf("%s again: %d cached tokens, want its own prompt's", model, r.Usage.PromptTokensDetails.CachedTokens)
		}
	}
}

func TestLoRA_AnAdapterLoadedAgainFindsItsBlocks(t *testing.T) {
	w := newWorker(t, loraConfig())
	msgs := []msg{{"user", words("Again.", 400)}}
	chatModel(t, w, "sql", msgs)
	if code, _, body := postLoRA(t, w, "/v1/unload_lora_adapter", `{"lora_name":"sql"}`); code != http.StatusOK {
		t.Fatalf("unload: %d %s", code, body)
	}
	if code, _, body := postLoRA(t, w, "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql2"}`); code != http.StatusOK {
		t.Fatalf("load: %d %s", code, body)
	}
	if r := chatModel(t, w, "sql", msgs); r.Usage.PromptTokensDetails.CachedTokens < 64 {
		t.Fatalf("%d cached tokens after loading it again", r.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestLoRA_TokenizeAcceptsAnAdapterAsModel(t *testing.T) {
	w := newWorker(t, loraConfig())
	msgs := []msg{{"user", "Count me."}}
	var got [][]uint32
	for _, model := range []string{"sim-model", "sql"} {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs})
		rec := do(t, w, http.MethodPost, "/tokenize", string(b))
		var r struct{ Tokens []uint32 }
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil || len(r.Tokens) == 0 {
			t.Fatalf("tokenize for %s: %d %s", model, rec.Code, rec.Body)
		}
		got = append(got, r.Tokens)
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Fatal("an adapter's tokens differ from its base model's: they share a tokenizer")
	}
}

// TestKVEvents_AnAdaptersBlocksAreStoredUnderItsName, in both encodings: the adapter's
// BlockStored events carry its name, so an index keys them under it, and a request's keys match
// them only when they are computed with that adapter.
func TestKVEvents_AnAdaptersBlocksAreStoredUnderItsName(t *testing.T) {
	for _, enc := range []string{KVEncodingArray, KVEncodingMap} {
		t.Run(enc, func(t *testing.T) {
			cfg := eventsConfig(t, enc)
			cfg.LoRAModules = loraConfig().LoRAModules
			w := newWorker(t, cfg)
			_, x := subscribeTo(t, w, cfg)
			msgs := []msg{{"user", words("Which table?", 200)}}
			chatModel(t, w, "chat", msgs)
			toks := tokenize(t, w, msgs)
			keys := func(lora string) []uint64 { return kvevents.Keys("sim-model", lora, "", toks, cfg.BlockSize) }
			waitUntilEvery(t, "the adapter's blocks to be indexed", 10*time.Millisecond, func() bool {
				return x.Match("w", keys("chat")).Blocks == len(keys("chat"))
			})
			for _, other := range []string{"", "sql"} {
				if m := x.Match("w", keys(other)); m.Blocks != 0 {
					t.Fatalf("keys for %q match %d of the adapter's blocks", other, m.Blocks)
				}
			}
		})
	}
}

// TestKVEvents_AnAdaptersBlockStoredCarriesItsNameIDAndExtraKeys reads one encoded BlockStored
// field by field, in both encodings: lora_id is vLLM's integer id of the adapter (the second
// loaded is 2), lora_name its name, and extra_keys one tuple per block holding the name.
func TestKVEvents_AnAdaptersBlockStoredCarriesItsNameIDAndExtraKeys(t *testing.T) {
	w := newWorker(t, loraConfig())
	ad, ok := w.loras.get("chat")
	if !ok || ad.id != 2 {
		t.Fatalf("adapter chat: %+v, want id 2", ad)
	}
	b := &pubBatch{events: []kvEvent{{kind: kvcache.Stored, hashes: []uint64{7, 8}, tokens: make([]uint32, 8), lora: ad}}}
	for _, maps := range []bool{false, true} {
		var fields map[string]any
		payload := encodeBatch(b, maps, 4)
		if maps {
			var batch struct {
				Events []map[string]any `msgpack:"events"`
			}
			if err := msgpack.Unmarshal(payload, &batch); err != nil {
				t.Fatal(err)
			}
			fields = batch.Events[0]
		} else {
			var batch []any
			if err := msgpack.Unmarshal(payload, &batch); err != nil {
				t.Fatal(err)
			}
			ev := batch[1].([]any)[0].([]any)
			fields = map[string]any{}
			for i, name := range []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"} {
				if i < len(ev) {
					fields[name] = ev[i]
				}
			}
		}
		if fmt.Sprint(fields["lora_id"]) != "2" || fields["lora_name"] != "chat" {
			t.Fatalf("maps %v: lora_id %#v lora_name %#v", maps, fields["lora_id"], fields["lora_name"])
		}
		if !reflect.DeepEqual(fields["extra_keys"], []any{[]any{"chat"}, []any{"chat"}}) {
			t.Fatalf("maps %v: extra_keys %#v", maps, fields["extra_keys"])
		}
	}
	base := &pubBatch{events: []kvEvent{{kind: kvcache.Stored, hashes: []uint64{7}, tokens: make([]uint32, 4)}}}
	var batch []any
	if err := msgpack.Unmarshal(encodeBatch(base, false, 4), &batch); err != nil {
		t.Fatal(err)
	}
	if ev := batch[1].([]any)[0].([]any); len(ev) != 8 || ev[5] != nil || ev[7] != nil {
		t.Fatalf("a base-model BlockStored: %#v, want lora_id and lora_name null and no extra_keys", ev)
	}
}
