package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// eventStream writes named server-sent events, as the Responses and Messages
// APIs stream:
//
//	event: response.output_text.delta
//	data: {"type":"response.output_text.delta",...}
//
// Every payload starts with its "type" member, equal to the event name.
type eventStream struct{ sseWriter }

func newEventStream(rw http.ResponseWriter, flushEach bool) *eventStream {
	return &eventStream{newSSEWriter(rw, flushEach)}
}

// sseWriter writes server-sent events to rw, each appended into one reused buffer and written
// with a single call: what the chat and completions streams (streamWriter) and the Responses and
// Messages streams (eventStream) share.
type sseWriter struct {
	rw        http.ResponseWriter
	rc        *http.ResponseController
	buf       []byte
	flushEach bool // flush every token event, not only the last event
}

func newSSEWriter(rw http.ResponseWriter, flushEach bool) sseWriter {
	return sseWriter{rw: rw, rc: http.NewResponseController(rw), buf: make([]byte, 0, 512), flushEach: flushEach}
}

// start sends the response headers at once, as vLLM does.
func (s *sseWriter) start() {
	h := s.rw.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	s.rw.WriteHeader(http.StatusOK)
	s.rc.Flush()
}

// write writes the buffer, flushing it to the client when flush is set.
func (s *sseWriter) write(flush bool) error {
	if _, err := s.rw.Write(s.buf); err != nil {
		return err
	}
	if flush {
		return s.rc.Flush()
	}
	return nil
}

// send writes one event whose data is {"type":name, extra..., fields...}:
// extra is raw JSON members (without braces) that follow "type", fields a
// value that marshals to a JSON object whose members come last.
func (s *eventStream) send(name string, extra []byte, fields any, flush bool) error {
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: {\"type\":"...)
	s.buf = appendJSONString(s.buf, name)
	if len(extra) > 0 {
		s.buf = append(s.buf, ',')
		s.buf = append(s.buf, extra...)
	}
	if fields != nil {
		b, err := marshalNoEscape(fields)
		if err != nil {
			return err
		}
		if len(b) > 2 { // not "{}"
			s.buf = append(s.buf, ',')
			s.buf = append(s.buf, b[1:len(b)-1]...)
		}
	}
	s.buf = append(s.buf, "}\n\n"...)
	return s.write(flush)
}

// marshalNoEscape marshals v as JSON without escaping <, > and &, so text
// that holds template markers stays readable.
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}
