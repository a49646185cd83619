package clientkeys

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func digestOf(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}

func mustParse(t *testing.T, text string) *Set {
	t.Helper()
	s, err := Parse("keys.txt", []byte(text))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func TestParse_PlainAndDigestEntriesAreBothAccepted(t *testing.T) {
	s := mustParse(t, "sk-plain-one\nsha256:"+digestOf("sk-hashed-two")+"\nsha256:"+strings.ToUpper(digestOf("sk-upper-hex"))+"\n")
	for _, key := range []string{"sk-plain-one", "sk-hashed-two", "sk-upper-hex"} {
		if _, ok := s.Lookup(key); !ok {
			t.Errorf("Lookup(%q) = false, want true", key)
		}
	}
	if s.Len() != 3 {
		t.Errorf("Len = %d, want 3", s.Len())
	}
}

func TestParse_TenantAndPriorityInAnyOrder(t *testing.T) {
	s := mustParse(t, "k1 tenant=team-a priority=high\nk2\tpriority=low\ttenant=team.b\nk3 tenant=team-a\nk4 priority=high\n")
	want := map[string]Client{
		"k1": {Tenant: "team-a", Priority: "high"},
		"k2": {Tenant: "team.b", Priority: "low"},
		"k3": {Tenant: "team-a"},
		"k4": {Tenant: DefaultTenant, Priority: "high"},
	}
	for key, w := range want {
		if got, ok := s.Lookup(key); !ok || got != w {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, true", key, got, ok, w)
		}
	}
	if got, w := s.Tenants(), []string{"default", "team-a", "team.b"}; !slices.Equal(got, w) {
		t.Errorf("Tenants = %q, want %q", got, w)
	}
	if got, w := s.Priorities(), []string{"high", "low"}; !slices.Equal(got, w) {
		t.Errorf("Priorities = %q, want %q", got, w)
	}
}

func TestParse_DefaultTenantListedOnlyWhenUsed(t *testing.T) {
	s := mustParse(t, "k1 tenant=a\n")
	if got := s.Tenants(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Tenants = %q, want [a]", got)
	}
	if got := s.Priorities(); len(got) != 0 {
		t.Errorf("Priorities = %q, want none", got)
	}
}

func TestParse_CommentsBlankLinesAndLineEndings(t *testing.T) {
	text := "\uFEFF# header comment\n\n   \t\n  # indented comment\r\nk1 tenant=a # trailing comment with tenant=zz!\r\n  k2  \r\nk3 #no-space-needed\n"
	s := mustParse(t, text)
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want 3", s.Len())
	}
	for _, key := range []string{"k1", "k2", "k3"} {
		if _, ok := s.Lookup(key); !ok {
			t.Errorf("Lookup(%q) = false", key)
		}
	}
	if c, _ := s.Lookup("k1"); c.Tenant != "a" {
		t.Errorf("k1 tenant = %q, want a (the comment must not count)", c.Tenant)
	}
	for _, notKey := range []string{"# header comment", "#", "header", "k2  ", "\uFEFF#"} {
		if _, ok := s.Lookup(notKey); ok {
			t.Errorf("Lookup(%q) = true, want false", notKey)
		}
	}
}

func TestParse_EmptyFileAcceptsNoKey(t *testing.T) {
	s := mustParse(t, "# nothing yet\n")
	if s.Len() != 0 || len(s.Tenants()) != 0 {
		t.Errorf("Len = %d, Tenants = %q; want an empty set", s.Len(), s.Tenants())
	}
	if _, ok := s.Lookup("anything"); ok {
		t.Error("an empty set accepted a key")
	}
}

// secret is a key that must never appear in an error message.
const secret = "sk-live-SECRET-0123456789abcdef"

func TestParse_MalformedLinesNameTheLineAndNeverTheKey(t *testing.T) {
	long := strings.Repeat("x", maxNameLen+1)
	cases := []struct {
		name string
		line string // placed on line 3, after a comment and a good entry
		want string // part of the reason
	}{
		{"unknown field", secret + " team=a", "field 2"},
		{"second key on the line", secret + " " + secret + "2", "field 2"},
		{"bad tenant char", secret + " tenant=a/b", "tenant name"},
		{"key pasted as tenant", "k9 tenant=" + secret + "!", "tenant name"},
		{"empty tenant", secret + " tenant=", "tenant name"},
		{"tenant too long", secret + " tenant=" + long, "tenant name"},
		{"tenant twice", secret + " tenant=a tenant=b", "twice"},
		{"bad priority", secret + " priority=hi!", "priority level"},
		{"priority twice", secret + " priority=1 priority=2", "twice"},
		{"short digest", "sha256:" + digestOf(secret)[:63], "64 hex"},
		{"long digest", "sha256:" + digestOf(secret) + "0", "64 hex"},
		{"non-hex digest", "sha256:" + strings.Repeat("g", 64), "64 hex"},
		{"digest of empty key", "sha256:" + digestOf(""), "empty key"},
		{"missing key", "tenant=" + secret, "key is missing"},
		{"missing key, priority", "priority=" + secret, "key is missing"},
		{"non-ascii key", secret + "é", "printable ASCII"},
		{"control byte in key", secret + "\x00", "printable ASCII"},
		{"duplicate key", "good-key tenant=b", "duplicate key (first on line 2)"},
		{"duplicate key as digest", "sha256:" + digestOf("good-key"), "duplicate key (first on line 2)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("keys.txt", []byte("# comment\ngood-key\n"+tc.line+"\nlater-key\n"))
			if err == nil {
				t.Fatal("Parse accepted a malformed line")
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line != 3 || pe.Path != "keys.txt" {
				t.Fatalf("error = %#v, want a *ParseError for keys.txt line 3", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "keys.txt:3:") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not say keys.txt:3: and %q", msg, tc.want)
			}
			for _, leak := range []string{secret, secret[:12], digestOf(secret)[:12], "good-key"} {
				if strings.Contains(msg, leak) {
					t.Errorf("error %q quotes key material %q", msg, leak)
				}
			}
		})
	}
}

func TestLookup_RightKeyAcceptedWrongKeysRefused(t *testing.T) {
	s := mustParse(t, "sk-alpha tenant=a\nsha256:"+digestOf("sk-beta")+" tenant=b\n")
	if c, ok := s.Lookup("sk-alpha"); !ok || c.Tenant != "a" {
		t.Errorf("Lookup(sk-alpha) = %+v, %v", c, ok)
	}
	if c, ok := s.Lookup("sk-beta"); !ok || c.Tenant != "b" {
		t.Errorf("Lookup(sk-beta) = %+v, %v", c, ok)
	}
	for _, wrong := range []string{"", "sk-alph", "sk-alpha ", "SK-ALPHA", "sk-alphaa", "sha256:" + digestOf("sk-beta"), digestOf("sk-beta")} {
		if c, ok := s.Lookup(wrong); ok {
			t.Errorf("Lookup(%q) = %+v, true; want refused", wrong, c)
		}
	}
	var none *Set
	if _, ok := none.Lookup("sk-alpha"); ok || none.Len() != 0 || none.Tenants() != nil {
		t.Error("a nil *Set must accept nothing")
	}
}

func TestSet_AccessorsReturnCopies(t *testing.T) {
	s := mustParse(t, "k1 tenant=a priority=p\n")
	s.Tenants()[0] = "mutated"
	s.Priorities()[0] = "mutated"
	if s.Tenants()[0] != "a" || s.Priorities()[0] != "p" {
		t.Error("modifying a returned slice changed the set")
	}
}

// findBytes walks v (following pointers, slices, arrays, maps and struct fields, exported or
// not) and reports the path of the first string or byte sequence that contains needle.
func findBytes(v reflect.Value, needle []byte, path string) (string, bool) {
	switch v.Kind() {
	case reflect.String:
		return path, strings.Contains(v.String(), string(needle))
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "", false
		}
		return findBytes(v.Elem(), needle, path)
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b := make([]byte, v.Len())
			for i := range b {
				b[i] = byte(v.Index(i).Uint())
			}
			return path, bytes.Contains(b, needle)
		}
		for i := range v.Len() {
			if p, ok := findBytes(v.Index(i), needle, path+"[i]"); ok {
				return p, true
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if p, ok := findBytes(it.Key(), needle, path+".key"); ok {
				return p, true
			}
			if p, ok := findBytes(it.Value(), needle, path+".value"); ok {
				return p, true
			}
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if p, ok := findBytes(v.Field(i), needle, path+"."+v.Type().Field(i).Name); ok {
				return p, true
			}
		}
	}
	return "", false
}

func TestSet_HoldsDigestsNotKeys(t *testing.T) {
	keys := []string{"sk-plaintext-key-0001", "sk-plaintext-key-0002-with-tenant"}
	s := mustParse(t, keys[0]+"\n"+keys[1]+" tenant=t1 priority=p1\n")
	if kt := reflect.TypeOf(s.byDigest).Key(); kt != reflect.TypeOf([sha256.Size]byte{}) {
		t.Errorf("keys are indexed by %v, want a SHA-256 digest", kt)
	}
	for _, key := range keys {
		if p, found := findBytes(reflect.ValueOf(s), []byte(key), "Set"); found {
			t.Errorf("the set holds the plaintext key at %s", p)
		}
		d := sha256.Sum256([]byte(key))
		if _, found := findBytes(reflect.ValueOf(s), d[:], "Set"); !found {
			t.Errorf("the set does not hold the digest of %q (is the scan working?)", key)
		}
	}
}

func TestLoad_ReadsTheFileAndWipesItsBuffer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("sk-from-file tenant=f\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := s.Lookup("sk-from-file"); !ok || c.Tenant != "f" {
		t.Errorf("Lookup = %+v, %v", c, ok)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestReadAllWiping_ReadsPastAWrongSizeHint(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 100)
	for _, hint := range []int64{-1, 0, 3, 999, 1000, 5000} {
		got, err := readAllWiping(bytes.NewReader(data), hint)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("hint %d: got %d bytes, %v; want the %d bytes", hint, len(got), err, len(data))
		}
	}
}

func TestGrowWiping_ZeroesTheOutgrownBuffer(t *testing.T) {
	old := []byte("sk-secret")
	grown := growWiping(old)
	if string(grown) != "sk-secret" || cap(grown) <= cap(old) {
		t.Errorf("grown = %q (cap %d), want the same bytes with more room than %d", grown, cap(grown), cap(old))
	}
	if !bytes.Equal(old[:cap(old)], make([]byte, cap(old))) {
		t.Errorf("the outgrown buffer still holds %q", old)
	}
}

func TestLookup_LongKeysAndNoAllocations(t *testing.T) {
	long := strings.Repeat("k", 600) // past the stack buffer of digestOfString
	edge := strings.Repeat("e", 512)
	s := mustParse(t, long+" tenant=long\n"+edge+" tenant=edge\nshort\n")
	for key, tenant := range map[string]string{long: "long", edge: "edge", "short": DefaultTenant} {
		if c, ok := s.Lookup(key); !ok || c.Tenant != tenant {
			t.Errorf("Lookup(%d-byte key) = %+v, %v; want tenant %q", len(key), c, ok, tenant)
		}
	}
	if _, ok := s.Lookup(long[:599]); ok {
		t.Error("a prefix of a long key was accepted")
	}
	presented := "sk-a-typical-key-of-about-one-hundred-bytes-" + strings.Repeat("x", 56)
	if n := testing.AllocsPerRun(100, func() { s.Lookup(presented) }); n != 0 {
		t.Errorf("Lookup of a %d-byte key allocates %.0f times, want 0", len(presented), n)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("sk-1 tenant=a priority=high\n# c\n\nsha256:" + digestOf("sk-2") + " tenant=b\n")
	f.Add("sk-1\r\nsk-1\r\n")
	f.Add("\uFEFFk tenant=a tenant=b")
	f.Add("tenant=x\n")
	f.Add("k #c tenant=\n")
	f.Fuzz(func(t *testing.T, text string) {
		lines := strings.Count(text, "\n") + 1
		s, err := Parse("f", []byte(text))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Line < 1 || pe.Line > lines {
				t.Fatalf("error %v is not a ParseError on one of the %d lines", err, lines)
			}
			return
		}
		if s.Len() > lines {
			t.Fatalf("%d keys from %d lines", s.Len(), lines)
		}
		for _, name := range append(s.Tenants(), s.Priorities()...) {
			if !validName([]byte(name)) {
				t.Fatalf("tenant or priority %q is not a valid label value", name)
			}
		}
		for line := range strings.SplitSeq(strings.TrimPrefix(text, "\uFEFF"), "\n") {
			fields := strings.FieldsFunc(line, isBlank)
			if len(fields) > 0 && fields[0][0] != '#' && !strings.HasPrefix(fields[0], digestPrefix) {
				if _, ok := s.Lookup(fields[0]); !ok {
					t.Fatalf("the key of line %q is not accepted", line)
				}
			}
		}
	})
}
