package cli

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The linker leaves out the methods nothing calls unless some linked code calls methods by name
// through reflection (text/template does, cobra's templates run it): then it keeps every exported
// method of every linked type, which made the binary half as large again. go-redis's FTCreate is
// one such method cacheroute never calls; finding it in the binary means that happened.
func TestBinaryLeavesOutExportedMethodsNothingCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go tool")
	}
	bin := filepath.Join(t.TempDir(), "cacheroute")
	build := exec.Command(gotool, "build", "-o", bin, "./cmd/cacheroute")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	symbols, err := exec.Command(gotool, "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	const unused = "github.com/redis/go-redis/v9.cmdable.FTCreate"
	for line := range strings.Lines(string(symbols)) {
		if strings.HasSuffix(strings.TrimSpace(line), " "+unused) {
			t.Fatalf("the binary holds %s, which nothing calls: some linked code calls methods by name "+
				"(text/template, a cobra template), so the linker kept every exported method", unused)
		}
	}
	if !strings.Contains(string(symbols), "github.com/redis/go-redis/v9.NewClient") {
		t.Fatal("go tool nm listed no go-redis symbol at all; the check above proves nothing")
	}
}
