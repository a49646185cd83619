// Package kvtransfer speaks the kv_transfer_params of vLLM's NIXL connector, the two-step KV
// transfer of prefill/decode disaggregation, as pure functions over JSON bodies: the prefill
// leg's body (PrefillBody: decode elsewhere, one token, not streamed), the prefill worker's
// answer read and its parameters checked (Answer, CheckParams), and the decode leg's body with
// those parameters (DecodeBody). The proxy sends the legs through its one attempt loop; which
// worker takes which leg is the policies'.
package kvtransfer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/tenant"
)

// prefillParams are the kv_transfer_params of a prefill leg: decode elsewhere.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// MaxAnswer bounds the prefill leg's answer the router reads: one token and its parameters.
const MaxAnswer = 1 << 20

// Answer reads a prefill leg's whole answer (at most MaxAnswer bytes): its kv_transfer_params,
// checked and re-encoded (CheckParams; nil when it carries none), and what its usage says of the
// prompt. An error says why the answer cannot be used: it is not JSON, or its parameters fail
// their check.
func Answer(body []byte) (json.RawMessage, sniff.Tokens, error) {
	var answer struct {
		KVTransferParams json.RawMessage    `json:"kv_transfer_params"`
		Usage            *sniff.UsageObject `json:"usage"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, sniff.Tokens{}, errors.New("the prefill leg's answer is not JSON")
	}
	var u sniff.Tokens
	if answer.Usage != nil {
		u = answer.Usage.Tokens()
	}
	if len(answer.KVTransferParams) == 0 || string(answer.KVTransferParams) == "null" {
		return nil, u, nil
	}
	params, err := CheckParams(answer.KVTransferParams)
	if err != nil {
		return nil, u, errors.New("the prefill worker's kv_transfer_params " + err.Error())
	}
	return params, u, nil
}

// ErrOwnTransfer is PrefillBody's answer for a request that carries kv_transfer_params itself.
var ErrOwnTransfer = errors.New("the request carries its own kv_transfer_params")

// PrefillBody is the prefill leg of a request body: the same request with kv_transfer_params
// asking for a remote decode, not streamed, generating one token.
func PrefillBody(body []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	if fields == nil {
		return nil, errors.New("the request is not a JSON object")
	}
	if _, own := fields["kv_transfer_params"]; own {
		return nil, ErrOwnTransfer
	}
	one := json.RawMessage("1")
	fields["kv_transfer_params"] = prefillParams
	fields["stream"] = json.RawMessage("false")
	delete(fields, "stream_options")
	fields["max_tokens"] = one
	for _, limit := range []string{"max_completion_tokens", "min_tokens"} {
		if _, ok := fields[limit]; ok {
			fields[limit] = one
		}
	}
	return json.Marshal(fields)
}

// DecodeBody is the decode leg of a request body: the request as it came, with the prefill
// worker's kv_transfer_params (checked by Answer) appended. body is a JSON object the route's
// reader accepted, which PrefillBody found without kv_transfer_params of its own.
func DecodeBody(body []byte, params json.RawMessage) []byte {
	return withField(body, "kv_transfer_params", params)
}

// withField returns a JSON object's bytes with one more member, key: value, at its end. obj is a
// JSON object which holds no member key.
func withField(obj []byte, key string, value []byte) []byte {
	end := bytes.LastIndexByte(obj, '}')
	inner := bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1 : end])
	out := make([]byte, 0, len(obj)+len(key)+len(value)+4)
	out = append(out, obj[:end]...)
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = strconv.AppendQuote(out, key)
	out = append(out, ':')
	out = append(out, value...)
	return append(out, obj[end:]...)
}

// CheckParams checks the kv_transfer_params a prefill worker answered with before they go to a
// decode worker, and returns them re-encoded: one member per name, compact, so that the decode
// worker reads exactly what was checked. The prefill worker is a peer like any other: its answer
// is bounded (MaxAnswer) and must have the shape of vLLM's NIXL connector's answer, which names
// the prefill engine and the blocks it holds:
//
//   - do_remote_prefill: true (do_remote_decode, when present, false);
//   - remote_engine_id: a non-empty string; remote_request_id, when present, a string;
//   - remote_block_ids: a list of block ids, or one such list per KV-cache group (what newer
//     vLLM sends for hybrid models), each id a non-negative integer;
//   - remote_host: an IP address or a host name; remote_port: an integer from 1 to 65535;
//   - tp_size, when present, a positive integer.
//
// Other members (what other connectors and later versions add) pass as they came.
func CheckParams(raw json.RawMessage) (json.RawMessage, error) {
	var params map[string]json.RawMessage
	if err := json.Unmarshal(raw, &params); err != nil || params == nil {
		return nil, errors.New("are not a JSON object")
	}
	var (
		prefill, decode   bool
		engine, request   string
		blocks            json.RawMessage
		host              string
		port, tensorRanks json.Number
	)
	for _, f := range []struct {
		name     string
		into     any
		required bool
	}{
		{"do_remote_prefill", &prefill, true},
		{"do_remote_decode", &decode, false},
		{"remote_engine_id", &engine, true},
		{"remote_request_id", &request, false},
		{"remote_block_ids", &blocks, true},
		{"remote_host", &host, true},
		{"remote_port", &port, true},
		{"tp_size", &tensorRanks, false},
	} {
		v, ok := params[f.name]
		switch {
		case !ok && f.required:
			return nil, fmt.Errorf("lack %s", f.name)
		case !ok:
			continue
		}
		if err := strictUnmarshal(v, f.into); err != nil {
			return nil, fmt.Errorf("have a %s of the wrong type: %s", f.name, shown(string(v)))
		}
	}
	switch {
	case !prefill:
		return nil, errors.New("do not ask for a remote prefill (do_remote_prefill is not true)")
	case decode:
		return nil, errors.New("ask for a remote decode (do_remote_decode is true)")
	case engine == "":
		return nil, errors.New("name no engine (remote_engine_id is empty)")
	case !blockIDs(blocks):
		return nil, fmt.Errorf("have remote_block_ids that are not lists of block ids: %s", shown(string(blocks)))
	case !validHost(host):
		return nil, fmt.Errorf("have a remote_host that is no host: %q", shown(host))
	case !inRange(port, 1, 65535):
		return nil, fmt.Errorf("have a remote_port out of range: %s", shown(port.String()))
	case tensorRanks != "" && !inRange(tensorRanks, 1, 1<<20):
		return nil, fmt.Errorf("have a tp_size that is no positive integer: %s", shown(tensorRanks.String()))
	}
	out, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// strictUnmarshal decodes v into a bool, a string, a json.Number or a json.RawMessage, refusing a
// value of another JSON type (null among them) where encoding/json would leave the zero value.
func strictUnmarshal(v json.RawMessage, into any) error {
	if string(v) == "null" {
		return errors.New("null")
	}
	if n, ok := into.(*json.Number); ok {
		if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
			return errors.New("not a number")
		}
		*n = json.Number(v)
		return nil
	}
	return json.Unmarshal(v, into)
}

// inRange reports whether n is an integer, written without fraction or exponent, in [lo, hi].
func inRange(n json.Number, lo, hi int64) bool {
	i, err := strconv.ParseInt(string(n), 10, 64)
	return err == nil && i >= lo && i <= hi
}

// blockIDs reports whether raw is a list of block ids, or a list of such lists (one per KV-cache
// group), every id a non-negative integer; lists may be empty.
func blockIDs(raw json.RawMessage) bool {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || items == nil {
		return false
	}
	nested := len(items) > 0 && items[0][0] == '['
	for _, item := range items {
		if !nested {
			if !blockID(item) {
				return false
			}
			continue
		}
		var ids []json.RawMessage
		if item[0] != '[' || json.Unmarshal(item, &ids) != nil {
			return false
		}
		for _, id := range ids {
			if !blockID(id) {
				return false
			}
		}
	}
	return true
}

// blockID reports whether v is a non-negative integer of at most 18 digits, written without sign,
// fraction or exponent.
func blockID(v json.RawMessage) bool {
	if len(v) == 0 || len(v) > 18 {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validHost reports whether h is an IP address (without zone) or a DNS host name
// (tenant.IsHostName). A transfer peer named otherwise (a URL, a host:port, spaces, an empty
// string) is no peer a decode worker can reach.
func validHost(h string) bool {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	return tenant.IsHostName(h)
}

// shown is s as an error message shows a peer's value: at most 64 bytes of it.
func shown(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}
