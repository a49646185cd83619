package tenant

import (
	"strings"
	"testing"
)

func TestName(t *testing.T) {
	tests := []struct {
		url  string
		rank int
		want string
	}{
		{"http://127.0.0.1:8000", -1, "http://127.0.0.1:8000"},
		{"http://127.0.0.1:8000", 0, "http://127.0.0.1:8000@0"},
		{"http://127.0.0.1:8000", 7, "http://127.0.0.1:8000@7"},
		{"https://gpu-3.internal/v", 12, "https://gpu-3.internal/v@12"},
	}
	for _, tt := range tests {
		if got := Name(tt.url, tt.rank); got != tt.want {
			t.Errorf("Name(%q, %d) = %q, want %q", tt.url, tt.rank, got, tt.want)
		}
	}
}

func TestBase(t *testing.T) {
	tests := []struct {
		name, tenant, want string
	}{
		{"no rank", "http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"rank 0", "http://127.0.0.1:8000@0", "http://127.0.0.1:8000"},
		{"rank 13", "http://127.0.0.1:8000@13", "http://127.0.0.1:8000"},
		{"userinfo is not a rank", "http://user@host:8000", "http://user@host:8000"},
		{"userinfo and rank", "http://user@host:8000@2", "http://user@host:8000"},
		{"empty suffix", "http://host:8000@", "http://host:8000@"},
		{"leading at", "@3", "@3"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Base(tt.tenant); got != tt.want {
				t.Errorf("Base(%q) = %q, want %q", tt.tenant, got, tt.want)
			}
		})
	}
}

func TestBaseInvertsName(t *testing.T) {
	for _, url := range []string{"http://a:1", "http://user@b:2", "https://c/path"} {
		for rank := -1; rank < 4; rank++ {
			if got := Base(Name(url, rank)); got != url {
				t.Errorf("Base(Name(%q, %d)) = %q", url, rank, got)
			}
		}
	}
}

func TestHasBase(t *testing.T) {
	for _, tc := range []struct {
		tenant, base string
		want         bool
	}{
		{"u", "u", true},
		{"u@0", "u", true},
		{"u@17", "u", true},
		{"u2", "u", false},
		{"ux@0", "u", false},
		{"u@", "u", false},
		{"u@r", "u", false},
		{"u@1@2", "u", false},
		{"v", "u", false},
		{"u", "u@1", false},
		{"u@1", "u@1", true},
	} {
		if got := HasBase(tc.tenant, tc.base); got != tc.want {
			t.Errorf("HasBase(%q, %q) = %v, want %v", tc.tenant, tc.base, got, tc.want)
		}
	}
}

func TestRedactDropsUserinfoKeepsRank(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"http://user:pw@10.0.0.1:8000", "http://10.0.0.1:8000"},
		{"http://user:pw@10.0.0.1:8000@3", "http://10.0.0.1:8000@3"},
		{"http://user@h:1@2", "http://h:1@2"},
		{"https://u:p@h/v1/path@x", "https://h/v1/path@x"},
		{"http://h:1/p@q@7", "http://h:1/p@q@7"},
		{"http://a:b@c@h:1", "http://h:1"},
		{"not a url", "not a url"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNormalizeURLTrimsAndRejects(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://h:8000/", "http://h:8000"},
		{" http://h:8000// ", "http://h:8000"},
		{"https://h/base/", "https://h/base"},
	} {
		got, err := NormalizeURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("NormalizeURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "h:8000", "ftp://h", "http://", "http://h?x=1", "http://h#f", "mailto:x@y", "http://u:secret@h:1?q"} {
		_, err := NormalizeURL(bad)
		if err == nil {
			t.Errorf("NormalizeURL(%q) accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("NormalizeURL(%q) error reveals the password: %v", bad, err)
		}
	}
}

// The OpenAI base URL of a worker (".../v1") is what users copy from their client configuration;
// the router would probe it at /v1/health and route to /v1/v1/..., so it is refused with the URL
// to give instead, on every path a worker URL enters (flags, config file, admin API).
func TestNormalizeURLRefusesTheOpenAIBaseURLAndNamesTheFix(t *testing.T) {
	for _, tc := range []struct{ in, fix string }{
		{"http://h:8000/v1", `"http://h:8000"`},
		{"http://h:8000/v1/", `"http://h:8000"`},
		{" https://gpu-3.internal/V1 ", `"https://gpu-3.internal"`},
		{"http://[::1]:8000/vllm/v1", `"http://[::1]:8000/vllm"`},
		{"http://user:secret@h:8000/v1", `"http://h:8000"`},
	} {
		_, err := NormalizeURL(tc.in)
		if err == nil {
			t.Errorf("NormalizeURL(%q) accepted a URL ending in /v1", tc.in)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "ends in /v1") || !strings.Contains(msg, tc.fix) {
			t.Errorf("NormalizeURL(%q) error %q does not say to drop /v1 and give %s", tc.in, msg, tc.fix)
		}
		if strings.Contains(msg, "secret") {
			t.Errorf("NormalizeURL(%q) error reveals the password: %v", tc.in, msg)
		}
	}
	// A path or host that merely contains v1 is a worker like any other.
	for _, ok := range []string{"http://v1:8000", "http://h/v1x", "http://h/apiv1", "http://h/v1/x", "http://h/v10"} {
		if _, err := NormalizeURL(ok); err != nil {
			t.Errorf("NormalizeURL(%q): %v", ok, err)
		}
	}
}
