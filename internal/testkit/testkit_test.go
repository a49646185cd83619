package testkit

import (
	"crypto/x509"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Only tests may import the kit: a router package that did would link the testing package.
func TestOnlyTestsImportTestkit(t *testing.T) {
	const self = "github.com/cacheroute/cacheroute/internal/testkit"
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		if strings.HasPrefix(filepath.ToSlash(path), "../../internal/testkit/") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == self {
				t.Errorf("%s imports %s, which only tests may", path, self)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("read only %d non-test Go files: not the repository's root?", checked)
	}
}

func TestSyncBufferLinesHoldEveryWordAsked(t *testing.T) {
	var b SyncBuffer
	_, _ = b.Write([]byte("level=WARN a b\nlevel=INFO a\n\nlevel=WARN b\n"))
	if got, want := b.Lines("level=WARN", "b"), []string{"level=WARN a b", "level=WARN b"}; !slices.Equal(got, want) {
		t.Errorf("Lines = %q, want %q", got, want)
	}
	if got := b.Lines(); len(got) != 3 {
		t.Errorf("Lines() = %q, want the 3 non-empty lines", got)
	}
}

func TestCAIssuesLeavesItsPoolVerifies(t *testing.T) {
	ca := NewCA(t, "test CA")
	for _, client := range []bool{false, true} {
		leaf := ca.Issue(t, 7, client)
		cert, err := x509.ParseCertificate(leaf.DER)
		if err != nil {
			t.Fatal(err)
		}
		usage := x509.ExtKeyUsageServerAuth
		if client {
			usage = x509.ExtKeyUsageClientAuth
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("client=%v: %v", client, err)
		}
		if !client {
			if err := cert.VerifyHostname("127.0.0.1"); err != nil {
				t.Errorf("server certificate: %v", err)
			}
		}
	}
}

func TestPollReportsWhetherTheConditionHeldInTime(t *testing.T) {
	if Poll(20*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Error("Poll reported a condition that never held")
	}
	n := 0
	if !Poll(Patience, time.Millisecond, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("Poll stopped after %d calls, want true at the third", n)
	}
}

func TestSendSendsTheBodyAsJSONWithTheHeaderPairs(t *testing.T) {
	var got http.Header
	s := NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("X-Seen", r.Method)
		_, _ = io.Copy(w, r.Body)
	})
	code, h, body := Send(t, nil, http.MethodPut, s.URL, `{"a":1}`, "X-One", "1", "x-two", "2")
	if code != http.StatusOK || h.Get("X-Seen") != http.MethodPut || body != `{"a":1}` {
		t.Errorf("answer %d %v %q", code, h, body)
	}
	if got.Get("Content-Type") != "application/json" || got.Get("X-One") != "1" || got.Get("X-Two") != "2" {
		t.Errorf("request headers %v", got)
	}
	if s.Hits.Load() != 1 {
		t.Errorf("server counted %d requests, want 1", s.Hits.Load())
	}
}
