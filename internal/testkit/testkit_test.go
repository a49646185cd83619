package testkit

import (
	"crypto/x509"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
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
