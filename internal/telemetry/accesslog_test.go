package telemetry

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestAccessLogWritesOneJSONLinePerEntry(t *testing.T) {
	var out testkit.SyncBuffer
	l := NewAccessLog(&out, nil)
	prompt, cached := 120, 96
	l.Log(Entry{RequestID: "r1", Route: "/v1/chat/completions", Status: 200, StatusClass: "2xx", PromptTokens: &prompt, CachedTokens: &cached})
	l.Log(Entry{RequestID: "r2", Route: "/v1/messages", Status: 529, StatusClass: "5xx"})
	l.Close()
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	var got []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 2 || got[0]["request_id"] != "r1" || got[0]["cached_tokens"] != float64(96) || got[1]["status"] != float64(529) {
		t.Fatalf("lines %v", got)
	}
	if _, ok := got[1]["prompt_tokens"]; ok {
		t.Error("unknown token counts must be left out, not written as 0")
	}
}

// blockedWriter never returns until released, as a full disk or a stalled pipe would.
type blockedWriter struct{ release chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) { <-w.release; return len(p), nil }

func TestAccessLogDropsEntriesRatherThanBlockRequests(t *testing.T) {
	w := blockedWriter{release: make(chan struct{})}
	var dropped atomic.Int64
	l := NewAccessLog(w, func() { dropped.Add(1) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2 * AccessLogQueue {
			l.Log(Entry{RequestID: strings.Repeat("x", i%7)})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Log blocked behind a writer that does not return")
	}
	if dropped.Load() < AccessLogQueue/2 {
		t.Fatalf("dropped %d of %d entries with a stalled writer; the queue holds %d", dropped.Load(), 2*AccessLogQueue, AccessLogQueue)
	}
	close(w.release)
	l.Close()
}

func TestSessionHashHidesTheKey(t *testing.T) {
	h := SessionHash("session:alice-secret")
	if h == "" || strings.Contains(h, "alice") || h != SessionHash("session:alice-secret") || h == SessionHash("session:bob") {
		t.Fatalf("hash %q", h)
	}
	if SessionHash("") != "" {
		t.Fatal("no key must have no hash")
	}
}

// withSalt runs the rest of the test under salt, and puts the process's salt back after it.
func withSalt(t *testing.T, salt string) {
	t.Helper()
	old := sessionSalt.Load()
	t.Cleanup(func() { sessionSalt.Store(old) })
	SetSessionSalt(salt)
}

func TestSessionHashIsNotTheUnsaltedHashOfTheKey(t *testing.T) {
	key := "session:1234"
	plain := sha256.Sum256([]byte(key))
	if SessionHash(key) == hex.EncodeToString(plain[:6]) {
		t.Fatal("the hash of a guessable id can be confirmed by hashing the guess")
	}
}

func TestSessionHashAgreesAcrossRoutersGivenTheSameSaltAndDiffersUnderAnother(t *testing.T) {
	withSalt(t, "replica-salt")
	a := SessionHash("session:1234")
	SetSessionSalt("other-salt")
	if b := SessionHash("session:1234"); b == a {
		t.Fatal("two salts gave one hash")
	}
	SetSessionSalt("replica-salt")
	if b := SessionHash("session:1234"); b != a {
		t.Fatalf("one salt gave %q and %q", a, b)
	}
	SetSessionSalt("") // keeps the salt in use
	if b := SessionHash("session:1234"); b != a {
		t.Fatalf("an empty salt changed the hash: %q, %q", a, b)
	}
}

// printHashEnv makes TestSessionHashDiffersBetweenProcessesByDefault's child print one hash.
const printHashEnv = "CACHEROUTE_TEST_PRINT_SESSION_HASH"

func TestSessionHashDiffersBetweenProcessesByDefault(t *testing.T) {
	if os.Getenv(printHashEnv) != "" {
		fmt.Println("hash=" + SessionHash("session:1234"))
		return
	}
	run := func() string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSessionHashDiffersBetweenProcessesByDefault$")
		cmd.Env = append(os.Environ(), printHashEnv+"=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if h, ok := strings.CutPrefix(line, "hash="); ok {
				return h
			}
		}
		t.Fatalf("child printed no hash: %s", out)
		return ""
	}
	if a, b := run(), run(); a == b {
		t.Fatalf("two processes without a configured salt gave the same hash %q", a)
	}
}
