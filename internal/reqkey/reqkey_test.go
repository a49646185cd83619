package reqkey_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/reqkey"
)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestSessionKeyTakesTheFirstNonBlankSourceInPrecedenceOrder(t *testing.T) {
	tests := []struct {
		name            string
		h               http.Header
		first           string
		sessions, users []string
		want            string
	}{
		{"session_params first", header("x-session-id", "h"), "p", []string{"s"}, []string{"u"}, "session:p"},
		{"then the session headers, in order", header("session-id", "late", "x-claude-code-session-id", "cc"), " ", []string{"s"}, nil, "session:cc"},
		{"then the body's session ids, in order", header("x-user-id", "uh"), "", []string{"  ", "s2", "s3"}, []string{"u"}, "session:s2"},
		{"then the user header", header("x-user-id", " uh "), "", []string{""}, []string{"u"}, "user:uh"},
		{"then the body's user ids", header(), "", nil, []string{"", "u2"}, "user:u2"},
		{"none", header("x-request-id", "r"), "", []string{" "}, []string{"\t"}, ""},
	}
	for _, tt := range tests {
		if got := reqkey.SessionKey(tt.h, tt.first, tt.sessions, tt.users); got != tt.want {
			t.Errorf("%s: SessionKey = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSessionKeyHashesLongIDsToOneFixedSize(t *testing.T) {
	exact := strings.Repeat("a", reqkey.MaxIDLen)
	if got := reqkey.SessionKey(header(), exact, nil, nil); got != "session:"+exact {
		t.Errorf("a %d-byte id was not kept verbatim: %q", reqkey.MaxIDLen, got)
	}
	k1 := reqkey.SessionKey(header(), exact+"b", nil, nil)
	k2 := reqkey.SessionKey(header(), exact+"c", nil, nil)
	k3 := reqkey.SessionKey(header(), "", nil, []string{strings.Repeat("x", 1<<16)})
	if k1 == k2 || len(k1) != len(k2) || !strings.HasPrefix(k1, "session:sha256:") || !strings.HasPrefix(k3, "user:sha256:") ||
		len(k3)-len("user:") != len(k1)-len("session:") {
		t.Errorf("long ids: %q %q %q", k1, k2, k3)
	}
}

func TestHashKeyTakesTheHeadersThenTheBodyIDsThenTheText(t *testing.T) {
	if got := reqkey.HashKey(header("x-trace-id", "t", "x-tenant-id", "ten"), []string{"b"}, "text"); got != "ten" {
		t.Errorf("headers: %q, want the first of HashKeyHeaders that is set", got)
	}
	if got := reqkey.HashKey(header("x-other", "o"), []string{" ", " b "}, "text"); got != "b" {
		t.Errorf("body ids: %q, want the first non-blank one, trimmed", got)
	}
	if got := reqkey.HashKey(header(), []string{""}, "text"); got != "text" {
		t.Errorf("no id: %q, want the text", got)
	}
}
