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

// writeError answers with an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, typ, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeFastError answers a routed request with an OpenAI-style error body.
func writeFastError(ctx *fasthttp.RequestCtx, status int, typ, code, message string) {
	body, _ := json.Marshal(apiError{Error: apiErrorBody{Message: message, Type: typ, Code: code}})
	ctx.Response.Header.Set("Content-Type", "application/json")
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	ctx.SetStatusCode(status)
	ctx.SetBody(append(body, '\n'))
}
