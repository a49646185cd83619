package proxy

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// maxFormModel is the longest model field read from a multipart body.
const maxFormModel = 1 << 10

// readMultipart reads what routing needs of a multipart/form-data body (the audio endpoints):
// its "model" field, and "stream". The body is forwarded as it came; nothing else of it is read
// or kept, and the audio file parts are passed over without being copied. Like the other
// load-only readers it derives no session or history key.
func readMultipart(h reqkey.Header, body []byte) (*protocol.Request, error) {
	mediaType, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mediaType != "multipart/form-data" || params["boundary"] == "" {
		return nil, &protocol.Error{Msg: "request body must be multipart/form-data with a boundary"}
	}
	r := &protocol.Request{}
	form := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		part, err := form.NextPart()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return nil, &protocol.Error{Msg: "malformed multipart body: " + err.Error()}
		}
		switch part.FormName() {
		case "model":
			v, err := io.ReadAll(io.LimitReader(part, maxFormModel+1))
			if err != nil || len(v) > maxFormModel {
				return nil, &protocol.Error{Msg: "the multipart field \"model\" is malformed or too long"}
			}
			r.Model = string(v)
		case "stream":
			v, _ := io.ReadAll(io.LimitReader(part, 16))
			r.Stream = string(v) == "true"
		}
		_ = part.Close()
	}
}
