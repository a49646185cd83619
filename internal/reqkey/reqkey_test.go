package reqkey_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestSessionKeyTakesTheFirstNonBlankSourceInPrecedenceOrder(t *testing.T) {
	tests := []struct {
		name            string
		h               http.Header
		first           string
		sessions, users []string
		want            string
	}{
		{"session_params first", testkit.Header("x-session-id", "h"), "p", []string{"s"}, []string{"u"}, "session:p"},
		{"then the session headers, in order", testkit.Header("session-id", "late", "x-claude-code-session-id", "cc"), " ", []string{"s"}, nil, "session:cc"},
		{"then the body's session ids, in order", testkit.Header("x-user-id", "uh"), "", []string{"  ", "s2", "s3"}, []string{"u"}, "session:s2"},
		{"then the user header", testkit.Header("x-user-id", " uh "), "", []string{""}, []string{"u"}, "user:uh"},
		{"then the body's user ids", testkit.Header(), "", nil, []string{"", "u2"}, "user:u2"},
		{"none", testkit.Header("x-request-id", "r"), "", []string{" "}, []string{"\t"}, ""},
	}
	for _, tt := range tests {
		if got := reqkey.SessionKey(tt.h, tt.first, tt.sessions, tt.users); got != tt.want {
			t.Errorf("%s: SessionKey = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestSessionKeyHashesLongIDsToOneFixedSize(t *testing.T) {
	exact := strings.Repeat("a", reqkey.MaxIDLen)
	if got := reqkey.SessionKey(testkit.Header(), exact, nil, nil); got != "session:"+exact {
		t.Errorf("a %d-byte id was not kept verbatim: %q", reqkey.MaxIDLen, got)
	}
	k1 := reqkey.SessionKey(testkit.Header(), exact+"b", nil, nil)
	k2 := reqkey.SessionKey(testkit.Header(), exact+"c", nil, nil)
	k3 := reqkey.SessionKey(testkit.Header(), "", nil, []string{strings.Repeat("x", 1<<16)})
	if k1 == k2 || len(k1) != len(k2) || !strings.HasPrefix(k1, "session:sha256:") || !strings.HasPrefix(k3, "user:sha256:") ||
		len(k3)-len("user:") != len(k1)-len("session:") {
		t.Errorf("long ids: %q %q %q", k1, k2, k3)
	}
}

func TestHashKeyTakesTheHeadersThenTheBodyIDsThenTheText(t *testing.T) {
	if got := reqkey.HashKey(testkit.Header("x-trace-id", "t", "x-tenant-id", "ten"), []string{"b"}, "text"); got != "ten" {
		t.Errorf("headers: %q, want the first of HashKeyHeaders that is set", got)
	}
	if got := reqkey.HashKey(testkit.Header("x-other", "o"), []string{" ", " b "}, "text"); got != "b" {
		t.Errorf("body ids: %q, want the first non-blank one, trimmed", got)
	}
	if got := reqkey.HashKey(testkit.Header(), []string{""}, "text"); got != "text" {
		t.Errorf("no id: %q, want the text", got)
	}
}
