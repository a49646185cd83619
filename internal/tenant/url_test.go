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

func TestParseURLRefusesWhatNormalizeURLRefuses(t *testing.T) {
	for _, raw := range []string{"", "127.0.0.1:8000", "ftp://127.0.0.1", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000?x=1"} {
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
