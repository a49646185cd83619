package sniff

import (
	"strings"
	"testing"
)

// The id of a stored response is found in a stream's first event that carries one, and at the
// head of a JSON answer, as soon as its bytes have passed; a nested "id" is not the response's.
func TestResponseIDIsFoundAsSoonAsItsBytesPassed(t *testing.T) {
	for _, tc := range []struct {
		name, answer, head string
		stream             bool
		want               string
	}{
		{"stream", "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\"}}\n\n", "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\"}}\n\n", true, "resp_1"},
		{"stream with CRLF", "event: response.created\r\ndata: {\"response\":{\"id\":\"resp_2\"}}\r\n\r\nevent: x\r\n\r\n", "event: response.created\r\ndata: {\"response\":{\"id\":\"resp_2\"}}\r\n\r\n", true, "resp_2"},
		{"json", `{"id":"resp_3","object":"response","output":[` + strings.Repeat(`{"id":"msg"},`, 1000) + `{}]}`, `{"id":"resp_3",`, false, "resp_3"},
		{"json, id after a nested one", `{"output":[{"id":"msg_1"}],"id":"resp_4"}`, "", false, "resp_4"},
		{"stream without a response", "data: {\"choices\":[]}\n\n", "", true, ""},
	} {
		s := NewResponseID(tc.stream)
		if tc.head != "" {
			s.Feed([]byte(tc.head))
			if got := s.Found(); got != tc.want {
				t.Errorf("%s: found %q once its head passed, want %q", tc.name, got, tc.want)
			}
			s.Feed([]byte(strings.TrimPrefix(tc.answer, tc.head)))
		} else {
			s.Feed([]byte(tc.answer))
		}
		if got := s.Result(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
