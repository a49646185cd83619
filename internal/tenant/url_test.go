package tenant

import "testing"

func TestParseURLGivesOneIdentityForEverySpellingOfAWorker(t *testing.T) {
	a, err := ParseURL(" http://127.0.0.1:8000/ ")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseURL("http://127.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a.String() != "http://127.0.0.1:8000" {
		t.Fatalf("ParseURL gave %q and %q, want both http://127.0.0.1:8000", a, b)
	}
	if a.IsZero() || a.HasCredentials() {
		t.Fatalf("%q: zero %v, credentials %v", a, a.IsZero(), a.HasCredentials())
	}
}

// Every spelling of one URL is one worker: path cleaned, default port and leading zeros left
// out, scheme and host name lower-cased, IP addresses in canonical form.
func TestParseURLSpellsEachWorkerOneWay(t *testing.T) {
	for want, spellings := range map[string][]string{
		"http://127.0.0.1:8000": {"http://127.0.0.1:8000", "http://127.0.0.1:8000/x/..", "http://127.0.0.1:8000/x/../", "HTTP://127.0.0.1:08000//",
			"http://127.0.0.1:8000/.", "http://[::ffff:127.0.0.1]:8000"},
		"http://localhost":             {"http://LocalHost:80", "http://localhost:80/", "http://localhost/a/b/../.."},
		"https://localhost":            {"https://localhost:443", "HTTPS://LOCALHOST:0443/"},
		"https://localhost:80":         {"https://localhost:80"},
		"http://[::1]:8000":            {"http://[0:0::1]:8000", "http://[0000:0000:0000:0000:0000:0000:0000:0001]:8000/"},
		"http://localhost:8000/a/b":    {"http://localhost:8000/a//b/", "http://localhost:8000/a/./x/../b", "http://localhost:8000/%61/b"},
		"http://localhost:8000/a%20b":  {"http://localhost:8000/a b", "http://localhost:8000/a%20b/"},
		"http://user:pw@localhost:900": {"http://user:pw@LOCALHOST:900/"},
	} {
		for _, raw := range spellings {
			u, err := ParseURL(raw)
			if err != nil || u.String() != want {
				t.Errorf("ParseURL(%q) = %q, %v; want %q", raw, u, err, want)
			}
		}
	}
}

func TestParseURLRefusesWhatNormalizeURLRefuses(t *testing.T) {
	for _, raw := range []string{"", "127.0.0.1:8000", "localhost:8000", "ftp://127.0.0.1", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/x/../v1/",
		"http://127.0.0.1:8000?x=1", "http://127.0.0.1:8000/?", "http://127.0.0.1:0", "http://127.0.0.1:65536", "http://:8000",
		"http://%25:8000", "http://a..b:8000", "http://-a:8000"} {
		if u, err := ParseURL(raw); err == nil || !u.IsZero() {
			t.Errorf("ParseURL(%q) = %q, %v; want the zero URL and an error", raw, u, err)
		}
	}
}

func TestURLRedactedHidesCredentials(t *testing.T) {
	u, err := ParseURL("http://user:pw@127.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	if !u.HasCredentials() || u.Redacted() != "http://127.0.0.1:8000" || u.String() != "http://user:pw@127.0.0.1:8000" {
		t.Fatalf("credentials %v, redacted %q, string %q", u.HasCredentials(), u.Redacted(), u.String())
	}
}

// The canonical form is its own canonical form: a worker's identity, given again, is the same
// worker.
func FuzzNormalizeURLIsIdempotent(f *testing.F) {
	for _, seed := range []string{"http://127.0.0.1:8000/x/..", "HTTPS://User:P%40ss@LOCALHOST:0443//a/./b/", "http://[0:0::1]:80/%61 b",
		"http://[fe80::1%25eth0]:1/", "http://h:8000/a@3", "http://h/%2F/x", "http://%25"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		once, err := NormalizeURL(raw)
		if err != nil {
			return
		}
		twice, err := NormalizeURL(once)
		if err != nil || twice != once {
			t.Fatalf("%q → %q → %q, %v", raw, once, twice, err)
		}
	})
}
