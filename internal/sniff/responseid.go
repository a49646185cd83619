package sniff

import (
	"bytes"
	"encoding/json"
)

// maxSniff bounds how much of an answer is looked at for the id of the response it stored.
const maxSniff = 64 << 10

// ResponseID finds the id of the response a worker stored, in its answer to POST /v1/responses:
// the top-level "id" of the JSON response object, or, in a stream, the response's id in the
// first event that carries one (response.created). It reads the answer as it is relayed and keeps
// at most maxSniff bytes of it; the relay is not held back.
type ResponseID struct {
	stream bool
	buf    []byte
	id     string
	done   bool // the id was found, or cannot be within the bytes kept
}

// NewResponseID returns a sniffer of an answer that is an event stream, or a JSON object.
func NewResponseID(stream bool) *ResponseID { return &ResponseID{stream: stream} }

// Feed looks at the next bytes of the answer. The id is known (Found) as soon as the bytes
// holding it have passed (a stream's first event; the head of a JSON answer, whose "id" comes
// first), so that it is remembered before the client can have the whole answer and send its next
// turn.
func (s *ResponseID) Feed(p []byte) {
	if s.done {
		return
	}
	keep := min(len(p), maxSniff-len(s.buf))
	s.buf = append(s.buf, p[:keep]...)
	switch {
	case s.stream:
		s.events()
	case len(s.buf) <= maxEarlyJSON:
		if id := jsonID(s.buf); id != "" {
			s.id, s.done = id, true
		}
	}
	if len(s.buf) >= maxSniff {
		s.done = true
	}
}

// maxEarlyJSON bounds the head of a JSON answer read for its id as it arrives; past it, the id is
// read once the answer has ended.
const maxEarlyJSON = 4 << 10

// events reads the complete events in the buffer, dropping each once read.
func (s *ResponseID) events() {
	for !s.done {
		end, sep := bytes.Index(s.buf, []byte("\n\n")), 2
		if crlf := bytes.Index(s.buf, []byte("\r\n\r\n")); crlf >= 0 && (end < 0 || crlf < end) {
			end, sep = crlf, 4
		}
		if end < 0 {
			return
		}
		if id := eventResponseID(s.buf[:end]); id != "" {
			s.id, s.done = id, true
		}
		s.buf = s.buf[:copy(s.buf, s.buf[end+sep:])]
	}
}

// eventResponseID is the id of the response an event's data carries, if any.
func eventResponseID(event []byte) string {
	for line := range bytes.Lines(event) {
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
		if !ok {
			continue
		}
		var e struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(bytes.TrimSpace(data), &e) == nil && e.Response.ID != "" {
			return e.Response.ID
		}
	}
	return ""
}

// Found is the id found so far; "" until its bytes have passed.
func (s *ResponseID) Found() string { return s.id }

// Result is the id found; a JSON answer is read once it has ended (or its first maxSniff bytes).
func (s *ResponseID) Result() string {
	if s.id == "" && !s.stream {
		s.id = jsonID(s.buf)
	}
	return s.id
}

// jsonID is the top-level "id" of the JSON object that data is (or begins), or "".
func jsonID(data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return ""
		}
		if key == "id" {
			var id string
			if dec.Decode(&id) != nil {
				return ""
			}
			return id
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
