package clientkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// writeFile replaces path by renaming a new file over it, as a careful operator would.
func writeFile(t testing.TB, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// reloads records what OnReload was told.
type reloads struct {
	mu   sync.Mutex
	errs []error // nil for a successful reload
}

func (r *reloads) record(_ *Set, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *reloads) all() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// newTestWatcher writes text to a keys file in a temp dir and watches it, logging into the
// returned buffer.
func newTestWatcher(t *testing.T, text string) (*Watcher, string, *reloads, *testkit.SyncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, text)
	rec := &reloads{}
	logs := &testkit.SyncBuffer{}
	w, err := NewWatcher(path, WatcherOptions{
		Interval: 5 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(logs, nil)),
		OnReload: rec.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, path, rec, logs
}

func TestNewWatcher_FailsOnABrokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "k1 tenant=bad/name\n")
	if _, err := NewWatcher(path, WatcherOptions{}); err == nil {
		t.Error("NewWatcher accepted a malformed file")
	}
	if _, err := NewWatcher(filepath.Join(t.TempDir(), "missing"), WatcherOptions{}); err == nil {
		t.Error("NewWatcher accepted a missing file")
	}
}

// A keys file with no key would refuse every client: at start that is a mistake (the wrong file,
// a file not yet written), and the router does not start with it.
func TestNewWatcher_RefusesAFileWithNoKey(t *testing.T) {
	for _, text := range []string{"", "# keys to come\n\n"} {
		path := filepath.Join(t.TempDir(), "keys")
		writeFile(t, path, text)
		_, err := NewWatcher(path, WatcherOptions{})
		if err == nil {
			t.Fatalf("NewWatcher accepted a file with no key (%q)", text)
		}
		if !strings.Contains(err.Error(), "no key") {
			t.Errorf("error %q does not say the file holds no key", err)
		}
	}
}

// Emptying the file of a running router is how every key is revoked at once: the reload is
// applied (and logged as such), not refused as a broken file would be.
func TestWatcher_ReloadOfAFileWithNoKeyRevokesEveryKey(t *testing.T) {
	w, path, rec, logs := newTestWatcher(t, "sk-old tenant=a\n")
	writeFile(t, path, "# every key revoked\n")
	if err := w.Reload(); err != nil {
		t.Fatalf("Reload of a file with no key: %v", err)
	}
	if _, ok := w.Lookup("sk-old"); ok {
		t.Error("a revoked key is still accepted")
	}
	if errs := rec.all(); len(errs) != 1 || errs[0] != nil {
		t.Errorf("OnReload saw %v, want one success", errs)
	}
	if !strings.Contains(logs.String(), "no key") {
		t.Errorf("the log does not say every client is now refused: %s", logs.String())
	}
}

func TestWatcher_ReloadPutsTheNewFileInUse(t *testing.T) {
	w, path, rec, _ := newTestWatcher(t, "sk-old tenant=a\n")
	writeFile(t, path, "sk-new tenant=b\n")
	if _, ok := w.Lookup("sk-new"); ok {
		t.Fatal("the new key was accepted before any reload")
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if c, ok := w.Lookup("sk-new"); !ok || c.Tenant != "b" {
		t.Errorf("Lookup(sk-new) = %+v, %v after Reload", c, ok)
	}
	if _, ok := w.Lookup("sk-old"); ok {
		t.Error("the removed key is still accepted after Reload")
	}
	if errs := rec.all(); len(errs) != 1 || errs[0] != nil {
		t.Errorf("OnReload saw %v, want one success", errs)
	}
}

func TestWatcher_PollReloadsOnceTheChangeHasSettled(t *testing.T) {
	w, path, rec, _ := newTestWatcher(t, "sk-old\n")
	w.poll()
	if len(rec.all()) != 0 {
		t.Fatal("a poll of the unchanged file reloaded it")
	}
	writeFile(t, path, "sk-new\n")
	w.poll() // sees the change for the first time: it may still be under way
	if _, ok := w.Lookup("sk-new"); ok {
		t.Fatal("reloaded on the poll that first saw the change")
	}
	w.poll() // the same change again: settled
	if _, ok := w.Lookup("sk-new"); !ok {
		t.Fatal("not reloaded on the poll that saw the change settled")
	}
	w.poll()
	if errs := rec.all(); len(errs) != 1 || errs[0] != nil {
		t.Errorf("OnReload saw %v, want exactly one success", errs)
	}
}

func TestWatcher_PollNoticesAnInPlaceRewrite(t *testing.T) {
	w, path, _, _ := newTestWatcher(t, "sk-old\n")
	if err := os.WriteFile(path, []byte("sk-rewritten-in-place\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.poll()
	w.poll()
	if _, ok := w.Lookup("sk-rewritten-in-place"); !ok {
		t.Error("an in-place rewrite of another size was not reloaded")
	}
}

func TestWatcher_RunReloadsWhenTheFileChanges(t *testing.T) {
	w, path, _, _ := newTestWatcher(t, "sk-old\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	}()

	writeFile(t, path, "sk-new tenant=n\n")
	testkit.WaitFor(t, "Run to reload the changed file", func() bool {
		c, ok := w.Lookup("sk-new")
		return ok && c.Tenant == "n"
	})
	if _, ok := w.Lookup("sk-old"); ok {
		t.Error("the removed key is still accepted")
	}
}

func TestWatcher_FailedReloadKeepsThePreviousSetAndLogsNoKey(t *testing.T) {
	w, path, rec, logs := newTestWatcher(t, "sk-old tenant=a\n")
	before := w.Current()
	writeFile(t, path, "sk-good\n"+secret+" tenant="+secret+"/\n") // a key pasted into tenant=

	err := w.Reload()
	if err == nil {
		t.Fatal("Reload accepted a malformed file")
	}
	if w.Current() != before {
		t.Error("a failed Reload replaced the set")
	}
	if c, ok := w.Lookup("sk-old"); !ok || c.Tenant != "a" {
		t.Errorf("Lookup(sk-old) = %+v, %v after a failed reload; want the old set kept", c, ok)
	}
	if _, ok := w.Lookup("sk-good"); ok {
		t.Error("a key of the rejected file was accepted")
	}

	w.poll() // the poll path must not retry (and re-log) a file it already failed to load
	w.poll()
	errs := rec.all()
	if len(errs) != 1 || errs[0] == nil {
		t.Fatalf("OnReload saw %v, want one failure", errs)
	}
	var pe *ParseError
	if !errors.As(errs[0], &pe) || pe.Line != 2 {
		t.Errorf("OnReload error = %v, want a ParseError on line 2", errs[0])
	}
	out := logs.String()
	if !bytes.Contains([]byte(out), []byte("reload failed")) || !bytes.Contains([]byte(out), []byte(":2:")) {
		t.Errorf("the log does not report the failure and its line:\n%s", out)
	}
	for _, leak := range []string{secret, secret[:12]} {
		if bytes.Contains([]byte(out), []byte(leak)) || bytes.Contains([]byte(err.Error()), []byte(leak)) {
			t.Errorf("key material %q reached the log or the error:\n%s", leak, out)
		}
	}
}

// A file that turns malformed or goes missing keeps the previous set, is reported once however
// many polls see it, and the file is loaded again once it is fixed.
func TestWatcher_BrokenFileKeepsThePreviousSetUntilFixed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		breaks func(t *testing.T, path string)
		isErr  func(error) bool
	}{
		{"malformed", func(t *testing.T, path string) { writeFile(t, path, "sk-new tenant=\n") }, func(err error) bool { return err != nil }},
		{"missing", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, func(err error) bool { return errors.Is(err, os.ErrNotExist) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, path, rec, _ := newTestWatcher(t, "sk-old\n")
			tc.breaks(t, path)
			for range 3 {
				w.poll()
			}
			if _, ok := w.Lookup("sk-old"); !ok {
				t.Error("the previous set was dropped")
			}
			if errs := rec.all(); len(errs) != 1 || !tc.isErr(errs[0]) {
				t.Errorf("OnReload saw %v, want one failure", errs)
			}
			writeFile(t, path, "sk-fixed\n")
			w.poll()
			w.poll()
			if _, ok := w.Lookup("sk-fixed"); !ok {
				t.Error("the fixed file was not loaded")
			}
		})
	}
}

func TestWatcher_ConcurrentLookupsDuringReloads(t *testing.T) {
	const keys = 200
	files := [2]string{}
	for i := range 2 {
		var b bytes.Buffer
		for k := range keys {
			fmt.Fprintf(&b, "sk-stable-%d tenant=t%d\n", k, i)
		}
		fmt.Fprintf(&b, "sk-only-in-%d\n", i)
		files[i] = b.String()
	}
	w, path, _, _ := newTestWatcher(t, files[0])

	var stop atomic.Bool
	var failures atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				c, ok := w.Lookup(fmt.Sprintf("sk-stable-%d", (i+g)%keys))
				if !ok || (c.Tenant != "t0" && c.Tenant != "t1") {
					failures.Add(1)
				}
				if _, ok := w.Lookup("sk-never"); ok {
					failures.Add(1)
				}
			}
		}()
	}
	for i := range 50 {
		writeFile(t, path, files[(i+1)%2])
		if err := w.Reload(); err != nil {
			t.Error(err)
		}
		w.poll()
	}
	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Errorf("%d lookups during reloads got a wrong answer", n)
	}
}

func TestWatcher_CheckRejectsASetLikeAMalformedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeFile(t, path, "sk-old priority=high\n")
	known := map[string]bool{"high": true, "low": true}
	errUnknown := errors.New("unknown priority level")
	check := func(s *Set) error {
		for _, p := range s.Priorities() {
			if !known[p] {
				return errUnknown
			}
		}
		return nil
	}
	rec := &reloads{}
	w, err := NewWatcher(path, WatcherOptions{Check: check, OnReload: rec.record, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, "sk-new priority=urgent\n")
	if err := w.Reload(); !errors.Is(err, errUnknown) {
		t.Fatalf("Reload = %v, want the Check error", err)
	}
	if _, ok := w.Lookup("sk-old"); !ok {
		t.Error("a set refused by Check replaced the old one")
	}
	if errs := rec.all(); len(errs) != 1 || !errors.Is(errs[0], errUnknown) {
		t.Errorf("OnReload saw %v, want the Check error", errs)
	}
	if _, err := NewWatcher(path, WatcherOptions{Check: check}); !errors.Is(err, errUnknown) {
		t.Errorf("NewWatcher = %v, want the Check error", err)
	}
}
