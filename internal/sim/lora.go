package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// lora.go serves LoRA adapters as vLLM does: adapters given at start (--lora-modules) or loaded
// and unloaded at run time (POST /v1/load_lora_adapter, /v1/unload_lora_adapter), each listed by
// GET /v1/models with its parent base model and its path, and served to any request that names
// it as its "model". There are no weights: an adapter changes nothing in the output, only the KV
// cache, where its blocks are keyed apart from the base model's and from every other adapter's,
// by its name, as vLLM folds the adapter's name into its block hashes. Its BlockStored events
// carry its name and vLLM's integer id for it.

// DefaultMaxLoRAs is how many adapters a worker serves at most when Config.MaxLoRAs is 0.
const DefaultMaxLoRAs = 16

// LoRAModule is one adapter served from the start, as vLLM's --lora-modules gives it.
type LoRAModule struct {
	// Name is the adapter's model id: what requests name as "model".
	Name string `json:"name"`
	// Path is where the adapter's weights would be; /v1/models lists it as the adapter's root.
	Path string `json:"path"`
	// Base is the base model it adapts, one of Config.Models; "" for the first.
	Base string `json:"base_model_name,omitempty"`
}

// ParseLoRAModule reads one --lora-modules value in either of vLLM's forms: name=path, or a JSON
// object {"name": ..., "path": ..., "base_model_name": ...}. As in vLLM, a value with "=" and no
// "," is the first form.
func ParseLoRAModule(s string) (LoRAModule, error) {
	var m LoRAModule
	if strings.Contains(s, "=") && !strings.Contains(s, ",") {
		name, path, _ := strings.Cut(s, "=")
		m = LoRAModule{Name: name, Path: path}
	} else {
		dec := json.NewDecoder(strings.NewReader(s))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			return m, fmt.Errorf("lora module %q: want name=path or a JSON object with name, path and base_model_name: %v", s, err)
		}
	}
	if m.Name == "" || m.Path == "" {
		return m, fmt.Errorf("lora module %q: both a name and a path are required", s)
	}
	return m, nil
}

// validateLoRAs checks the adapters of c against its models and its bound.
func (c Config) validateLoRAs() error {
	var errs []error
	if c.MaxLoRAs < 0 {
		errs = append(errs, fmt.Errorf("max loras %d must not be negative", c.MaxLoRAs))
	}
	if limit := c.maxLoRAs(); len(c.LoRAModules) > limit {
		errs = append(errs, fmt.Errorf("%d lora modules exceed max loras %d", len(c.LoRAModules), limit))
	}
	seen := map[string]bool{}
	for _, m := range c.Models {
		seen[m] = true
	}
	for _, m := range c.LoRAModules {
		switch {
		case m.Name == "" || m.Path == "":
			errs = append(errs, fmt.Errorf("lora module %q: both a name and a path are required", m.Name))
		case seen[m.Name]:
			errs = append(errs, fmt.Errorf("lora module %q: the name is already a model or another adapter", m.Name))
		case m.Base != "" && !slices.Contains(c.Models, m.Base):
			errs = append(errs, fmt.Errorf("lora module %q: base model %q is not served (--model)", m.Name, m.Base))
		}
		seen[m.Name] = true
	}
	return errors.Join(errs...)
}

func (c Config) maxLoRAs() int {
	if c.MaxLoRAs == 0 {
		return DefaultMaxLoRAs
	}
	return c.MaxLoRAs
}

// adapter is one served LoRA adapter.
type adapter struct {
	name, path, parent string
	// id is vLLM's lora_int_id: 1 for the first adapter loaded, counting up, never reused.
	id int
}

// adapters are the worker's LoRA adapters, in the order they were loaded.
type adapters struct {
	mu     sync.Mutex
	max    int
	list   []adapter
	lastID int
}

// get returns the adapter named name, if one is served.
func (a *adapters) get(name string) (adapter, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ad := range a.list {
		if ad.name == name {
			return ad, true
		}
	}
	return adapter{}, false
}

// all returns the adapters served, in load order.
func (a *adapters) all() []adapter {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]adapter(nil), a.list...)
}

// errLoRAExists and errLoRAsFull are why load refuses an adapter.
var (
	errLoRAExists = errors.New("already loaded")
	errLoRAsFull  = errors.New("full")
)

// load adds an adapter of parent, unless its name is taken or max adapters are served.
func (a *adapters) load(name, path, parent string) (adapter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ad := range a.list {
		if ad.name == name {
			return adapter{}, errLoRAExists
		}
	}
	if len(a.list) >= a.max {
		return adapter{}, errLoRAsFull
	}
	a.lastID++
	ad := adapter{name: name, path: path, parent: parent, id: a.lastID}
	a.list = append(a.list, ad)
	return ad, nil
}

// unload removes the adapter named name, and reports whether there was one.
func (a *adapters) unload(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, ad := range a.list {
		if ad.name == name {
			a.list = append(a.list[:i], a.list[i+1:]...)
			return true
		}
	}
	return false
}

// writeTypedError writes a vLLM-style error body whose type is typ.
func (w *Worker) writeTypedError(rw http.ResponseWriter, code int, typ, msg string) {
	if code < 500 {
		w.count(func(s *Stats) { s.Rejected++ })
	}
	writeJSON(rw, code, errorBody{Object: "error", Message: msg, Type: typ, Param: nil, Code: code})
}

// writeText answers 200 with msg as plain text, as vLLM answers a LoRA load or unload.
func writeText(rw http.ResponseWriter, msg string) {
	rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	rw.Header().Set("Content-Length", strconv.Itoa(len(msg)))
	rw.WriteHeader(http.StatusOK)
	_, _ = rw.Write([]byte(msg))
}

type loraRequest struct {
	LoRAName string `json:"lora_name"`
	LoRAPath string `json:"lora_path"`
}

// readLoRARequest decodes a load or unload body; on failure it has answered the client.
func (w *Worker) readLoRARequest(rw http.ResponseWriter, r *http.Request) (loraRequest, bool) {
	var req loraRequest
	if err := readJSON(rw, r, &req); err != nil {
		w.writeClientError(rw, err)
		return req, false
	}
	return req, true
}

// handleLoadLoRA serves POST /v1/load_lora_adapter {lora_name, lora_path}: the adapter of the
// first base model is served from then on.
func (w *Worker) handleLoadLoRA(rw http.ResponseWriter, r *http.Request) {
	req, ok := w.readLoRARequest(rw, r)
	if !ok {
		return
	}
	if req.LoRAName == "" || req.LoRAPath == "" {
		w.writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	if w.models[req.LoRAName] {
		w.writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has the name of a base model.", req.LoRAName))
		return
	}
	switch _, err := w.loras.load(req.LoRAName, req.LoRAPath, w.cfg.Models[0]); {
	case errors.Is(err, errLoRAExists):
		w.writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.LoRAName))
	case errors.Is(err, errLoRAsFull):
		w.writeTypedError(rw, http.StatusBadRequest, "BadRequestError", fmt.Sprintf(
			"The lora adapter '%s' cannot be loaded: %d adapters are loaded, the most this worker serves (--max-loras); unload one first.", req.LoRAName, w.loras.max))
	default:
		writeText(rw, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoRAName))
	}
}

// handleUnloadLoRA serves POST /v1/unload_lora_adapter {lora_name}. The adapter's blocks stay in
// the cache until evicted, as in vLLM; loaded again under its name, it hits them again.
func (w *Worker) handleUnloadLoRA(rw http.ResponseWriter, r *http.Request) {
	req, ok := w.readLoRARequest(rw, r)
	if !ok {
		return
	}
	if req.LoRAName == "" {
		w.writeTypedError(rw, http.StatusBadRequest, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
		return
	}
	if !w.loras.unload(req.LoRAName) {
		w.writeTypedError(rw, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName))
		return
	}
	writeText(rw, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoRAName))
}
