package proxy

import (
	"encoding/json"
	"testing"
)

func TestPrefillBodyAsksForARemoteDecodeOfOneTokenNotStreamed(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":300,"max_completion_tokens":300,"min_tokens":5,"temperature":0.2}`
	out, err := prefillBody([]byte(in))
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
	if out, _ := prefillBody([]byte(`{"model":"m","prompt":"x"}`)); json.Unmarshal(out, &plain) != nil || plain["max_completion_tokens"] != nil || plain["max_tokens"] != 1.0 {
		t.Fatalf("a limit the request did not set was added: %s", out)
	}
	if _, err := prefillBody([]byte(`[1]`)); err == nil {
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
