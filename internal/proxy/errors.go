package proxy

import (
	"encoding/json"
	"net/http"

	"github.com/valyala/fasthttp"
)

// Error body shape of the OpenAI API: {"error":{"message","type","code"}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// WriteError answers a net/http request with an OpenAI error body: the router's own endpoints'
// error shape.
func WriteError(w http.ResponseWriter, status int, typ, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
}

// errorShape is the error body of a route's protocol.
type errorShape uint8

const (
	openAIErrors    errorShape = iota // {"error":{"message","type","code"}}
	anthropicErrors                   // {"type":"error","error":{"type","message"}}
)

// Error body shape of the Anthropic API.
type anthropicError struct {
	Type  string             `json:"type"` // always "error"
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicStatus maps the status of an answer the router makes itself to the one the
// Anthropic API gives for that case, with its error type: it answers "no capacity" with 529.
func anthropicStatus(status int) (int, string) {
	switch status {
	case 400, 405, 408, 415, 431:
		return status, "invalid_request_error"
	case 401:
		return status, "authentication_error"
	case 403:
		return status, "permission_error"
	case 404:
		return status, "not_found_error"
	case 413:
		return status, "request_too_large"
	case 429:
		return status, "rate_limit_error"
	case 503:
		return statusOverloaded, "overloaded_error"
	case 504:
		return status, "timeout_error"
	}
	if status >= 500 {
		return status, "api_error"
	}
	return status, "invalid_request_error"
}

// writeFastError answers a routed request with an error body of the given shape. typ and code are
// OpenAI's error type and code; an Anthropic body carries the type that matches the status.
// It returns the status written.
func writeFastError(ctx *fasthttp.RequestCtx, shape errorShape, status int, typ, code, message string) int {
	var body []byte
	if shape == anthropicErrors {
		var atyp string
		status, atyp = anthropicStatus(status)
		body, _ = json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: atyp, Message: message}})
	} else {
		body, _ = json.Marshal(apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
	}
	ctx.Response.Header.Set("Content-Type", "application/json")
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	setStatus(&ctx.Response.Header, status)
	ctx.SetBody(append(body, '\n'))
	return status
}

// statusOverloaded is the status Anthropic's API answers when it has no capacity.
const statusOverloaded = 529

// setStatus sets status with its reason phrase: fasthttp's own, and for 529, which has no
// standard one, the phrase Anthropic's API sends ("Unknown Status Code" otherwise).
func setStatus(h *fasthttp.ResponseHeader, status int) {
	h.SetStatusCode(status)
	if status == statusOverloaded {
		h.SetStatusMessage([]byte("Overloaded"))
	}
}
