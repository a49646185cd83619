package tenant

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestIDKeepsCredentialsButNeverShowsThem(t *testing.T) {
	id := IDOf("http://user:secret@10.0.0.1:8000", 2)
	if string(id) != "http://user:secret@10.0.0.1:8000@2" {
		t.Fatalf("stored form %q", string(id))
	}
	if id == IDOf("http://other:key@10.0.0.1:8000", 2) {
		t.Fatal("two workers told apart by their credentials have one ID")
	}
	const shown = "http://10.0.0.1:8000@2"
	if id.Redacted() != shown {
		t.Fatalf("shown as %q, want %q", id.Redacted(), shown)
	}
	for _, h := range []func(*bytes.Buffer) slog.Handler{
		func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var b bytes.Buffer
		slog.New(h(&b)).Info("m", "worker", id)
		if strings.Contains(b.String(), "secret") || !strings.Contains(b.String(), shown) {
			t.Errorf("logged as %s", b.String())
		}
	}
}
