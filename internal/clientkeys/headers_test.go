package clientkeys

import (
	"net/http"
	"strings"
	"testing"
)

func TestFromHeaders(t *testing.T) {
	cases := []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"Bearer", map[string]string{"Authorization": "Bearer sk-1"}, "sk-1"},
		{"bearer, lower case", map[string]string{"Authorization": "bearer sk-1"}, "sk-1"},
		{"BEARER, upper case", map[string]string{"Authorization": "BEARER sk-1"}, "sk-1"},
		{"extra spaces around the token", map[string]string{"Authorization": "  Bearer   sk-1 \t"}, "sk-1"},
		{"x-api-key alone", map[string]string{"X-Api-Key": "sk-2"}, "sk-2"},
		{"x-api-key trimmed", map[string]string{"X-Api-Key": " sk-2\t"}, "sk-2"},
		{"both: Authorization wins", map[string]string{"Authorization": "Bearer sk-1", "X-Api-Key": "sk-2"}, "sk-1"},
		{"neither", map[string]string{"Content-Type": "application/json"}, ""},
		{"Basic scheme is not a bearer token", map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, ""},
		{"Basic scheme falls back to x-api-key", map[string]string{"Authorization": "Basic dXNlcjpwYXNz", "X-Api-Key": "sk-2"}, "sk-2"},
		{"scheme without a token", map[string]string{"Authorization": "Bearer"}, ""},
		{"scheme and blanks only", map[string]string{"Authorization": "Bearer   "}, ""},
		{"no space after the scheme", map[string]string{"Authorization": "Bearersk-1"}, ""},
		{"tab instead of space", map[string]string{"Authorization": "Bearer\tsk-1"}, ""},
		{"two tokens", map[string]string{"Authorization": "Bearer sk-1 sk-3"}, ""},
		{"malformed Authorization falls back to x-api-key", map[string]string{"Authorization": "Bearer", "X-Api-Key": "sk-2"}, "sk-2"},
		{"token only, no scheme", map[string]string{"Authorization": "sk-1"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			if got := FromHeaders(h.Get); got != tc.want {
				t.Errorf("FromHeaders(%q) = %q, want %q", tc.headers, got, tc.want)
			}
		})
	}
}

func TestFromHeaders_AsksForTheCanonicalNames(t *testing.T) {
	var asked []string
	FromHeaders(func(name string) string { asked = append(asked, name); return "" })
	if len(asked) != 2 || asked[0] != "Authorization" || asked[1] != "X-Api-Key" {
		t.Errorf("asked for %q, want [Authorization X-Api-Key]", asked)
	}
}

func FuzzFromHeaders(f *testing.F) {
	f.Add("Bearer sk-1", "")
	f.Add("bEaReR  sk-1 ", "sk-2")
	f.Add("Basic abc", " sk-2 ")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, authorization, apiKey string) {
		got := FromHeaders(func(name string) string {
			switch name {
			case "Authorization":
				return authorization
			case "X-Api-Key":
				return apiKey
			}
			return ""
		})
		if token, ok := bearerToken(authorization); ok {
			if got != token || token == "" {
				t.Fatalf("got %q, want the bearer token %q", got, token)
			}
			return
		}
		if len(got) > 0 && (got[0] == ' ' || got[len(got)-1] == ' ') {
			t.Fatalf("got %q with surrounding blanks", got)
		}
		if got != "" && !strings.Contains(apiKey, got) {
			t.Fatalf("got %q, which is not part of x-api-key %q", got, apiKey)
		}
	})
}
