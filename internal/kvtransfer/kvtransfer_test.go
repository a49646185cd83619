package kvtransfer

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"
)

func TestPrefillBodyAsksForARemoteDecodeOfOneTokenNotStreamed(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":300,"max_completion_tokens":300,"min_tokens":5,"temperature":0.2}`
	out, err := PrefillBody([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	params, _ := got["kv_transfer_params"].(map[string]any)
	if params["do_remote_decode"] != true || params["do_remote_prefill"] != false || len(params) != 6 {
		t.Fatalf("kv_transfer_params %v", params)
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens", "min_tokens"} {
		if got[k] != 1.0 {
			t.Errorf("%s = %v, want 1", k, got[k])
		}
	}
	if got["stream"] != false || got["stream_options"] != nil || got["temperature"] != 0.2 || got["model"] != "m" {
		t.Fatalf("prefill leg %s", out)
	}
	if _, ok := got["min_tokens"]; !ok {
		t.Fatal("min_tokens dropped")
	}
	var plain map[string]any
	if out, _ := PrefillBody([]byte(`{"model":"m","prompt":"x"}`)); json.Unmarshal(out, &plain) != nil || plain["max_completion_tokens"] != nil || plain["max_tokens"] != 1.0 {
		t.Fatalf("a limit the request did not set was added: %s", out)
	}
	if _, err := PrefillBody([]byte(`[1]`)); err == nil {
		t.Fatal("a body that is no object made a prefill leg")
	}
}

func TestWithFieldAppendsOneMemberToAnObject(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1}`:       `{"a":1,"k":{"x":true}}`,
		"{\"a\":1}\n  ": "{\"a\":1,\"k\":{\"x\":true}}\n  ",
		`{}`:            `{"k":{"x":true}}`,
		` { } `:         ` { "k":{"x":true}} `,
		`{"s":"}{"   }`: `{"s":"}{"   ,"k":{"x":true}}`,
	} {
		got := string(withField([]byte(in), "k", []byte(`{"x":true}`)))
		if got != want {
			t.Errorf("withField(%q) = %q, want %q", in, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("withField(%q) = %q is not JSON", in, got)
		}
	}
}

// What vLLM's NIXL connector answers a prefill leg with passes, re-encoded with one member per
// name: the older form (one list of block ids), the newer (one list per KV-cache group, a request
// id), and members of other connectors or later versions, which pass as they came.
func TestTransferParamsOfVLLMsConnectorsPass(t *testing.T) {
	for _, in := range []string{
		`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1,2],"remote_engine_id":"e-1","remote_host":"localhost","remote_port":5600,"tp_size":1}`,
		`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4,5],[]],"remote_engine_id":"9f2c","remote_request_id":"cmpl-1","remote_host":"127.0.0.2","remote_port":5601,"tp_size":2}`,
		`{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"::1","remote_port":65535,"last_token_id":7,"remote_multi_nodes_meta_mapping":{"0":{"host":"h"}}}`,
		`{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"prefill-0.vllm.localhost.","remote_port":1,"remote_port":2}`,
	} {
		out, err := CheckParams(json.RawMessage(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		var got, want map[string]any
		if json.Unmarshal(out, &got) != nil || json.Unmarshal([]byte(in), &want) != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s became %s", in, out)
		}
		if bytes.Count(out, []byte(`"remote_port"`)) != 1 {
			t.Errorf("%s: a member twice in %s", in, out)
		}
	}
}

// An answer of another shape is refused with a reason: not an object, a member missing or of the
// wrong type, a host that is no host, a port out of range.
func TestTransferParamsOfAnotherShapeAreRefused(t *testing.T) {
	good := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []int{0, 1},
		"remote_engine_id": "e", "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1}
	with := func(key string, v any) string {
		m := maps.Clone(good)
		if v == nil {
			delete(m, key)
		} else {
			m[key] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, c := range []struct{ in, why string }{
		{`"do_remote_prefill"`, "not a JSON object"},
		{`[1]`, "not a JSON object"},
		{`7`, "not a JSON object"},
		{with("do_remote_prefill", nil), "lack do_remote_prefill"},
		{with("do_remote_prefill", false), "do_remote_prefill is not true"},
		{with("do_remote_prefill", "true"), "do_remote_prefill of the wrong type"},
		{with("do_remote_decode", true), "do_remote_decode is true"},
		{with("remote_engine_id", nil), "lack remote_engine_id"},
		{with("remote_engine_id", ""), "remote_engine_id is empty"},
		{with("remote_engine_id", 12), "remote_engine_id of the wrong type"},
		{with("remote_request_id", []int{1}), "remote_request_id of the wrong type"},
		{with("remote_block_ids", nil), "lack remote_block_ids"},
		{with("remote_block_ids", "0,1"), "not lists of block ids"},
		{with("remote_block_ids", []any{1, -2}), "not lists of block ids"},
		{with("remote_block_ids", []any{1.5}), "not lists of block ids"},
		{with("remote_block_ids", []any{1, []int{2}}), "not lists of block ids"},
		{with("remote_block_ids", []any{[]int{2}, 3}), "not lists of block ids"},
		{with("remote_block_ids", []any{[]any{2, nil}}), "not lists of block ids"},
		{with("remote_block_ids", []any{nil}), "not lists of block ids"},
		{with("remote_host", nil), "lack remote_host"},
		{with("remote_host", ""), "no host"},
		{with("remote_host", "127.0.0.1:5600"), "no host"},
		{with("remote_host", "http://127.0.0.1"), "no host"},
		{with("remote_host", "local host"), "no host"},
		{with("remote_host", "-bad.localhost"), "no host"},
		{with("remote_host", "fe80::1%eth0"), "no host"},
		{with("remote_host", strings.Repeat("a.", 130)), "no host"},
		{with("remote_host", 127001), "remote_host of the wrong type"},
		{with("remote_port", nil), "lack remote_port"},
		{with("remote_port", "5600"), "remote_port of the wrong type"},
		{with("remote_port", 0), "out of range"},
		{with("remote_port", 65536), "out of range"},
		{with("remote_port", -1), "out of range"},
		{with("remote_port", 5600.5), "out of range"},
		{strings.Replace(with("remote_port", 1), `"remote_port":1`, `"remote_port":5.6e3`, 1), "out of range"},
		{with("tp_size", 0), "tp_size"},
		{with("tp_size", "2"), "tp_size of the wrong type"},
		{strings.Replace(with("remote_host", "h"), `"h"`, `null`, 1), "remote_host of the wrong type"},
	} {
		out, err := CheckParams(json.RawMessage(c.in))
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %s, %v; want an error saying %q", c.in, out, err, c.why)
		}
	}
}

// Whatever a prefill worker answers, the check neither panics nor passes anything a second check
// would refuse, and what passes is an object asking for a remote prefill.
func FuzzCheckParams(f *testing.F) {
	f.Add([]byte(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4,5],[]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"127.0.0.2","remote_port":5601,"tp_size":2}`))
	f.Add([]byte(`{"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"a_b.c.","remote_port":1}`))
	f.Add([]byte(`{"remote_port":"x"}`))
	f.Add([]byte(`"s"`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // the answer's decoder refuses it before the check
		}
		out, err := CheckParams(raw)
		if err != nil {
			return
		}
		again, err := CheckParams(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("%s passed as %s, which checks as %s, %v", raw, out, again, err)
		}
		var p struct {
			Prefill bool `json:"do_remote_prefill"`
		}
		if json.Unmarshal(out, &p) != nil || !p.Prefill {
			t.Fatalf("%s passed without do_remote_prefill", raw)
		}
	})
}

// A prefill leg's answer gives its checked parameters and what its usage says of the prompt; an
// answer without parameters gives none, and one that is not JSON or whose parameters fail their
// check says why.
func TestAnswerGivesTheCheckedParametersAndTheUsage(t *testing.T) {
	params, u, err := Answer([]byte(`{"choices":[],"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":256}},"kv_transfer_params":{"remote_port":5600,"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1],"remote_host":"127.0.0.1"}}`))
	if err != nil || !json.Valid(params) || !u.OK || u.Prompt != 300 || u.Cached != 256 {
		t.Fatalf("params %s, usage %+v, %v; want the parameters and 300 tokens, 256 cached", params, u, err)
	}
	for _, body := range []string{`{"choices":[]}`, `{"kv_transfer_params":null}`} {
		if params, _, err := Answer([]byte(body)); params != nil || err != nil {
			t.Errorf("%s: params %s, %v; want none, no error", body, params, err)
		}
	}
	for body, why := range map[string]string{
		`{"kv_transfer_params":`:                            "not JSON",
		`{"kv_transfer_params":{"do_remote_prefill":true}}`: "lack remote_engine_id",
	} {
		if params, _, err := Answer([]byte(body)); params != nil || err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: params %s, %v; want an error saying %q", body, params, err, why)
		}
	}
}
