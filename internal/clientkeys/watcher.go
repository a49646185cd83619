package clientkeys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPollInterval is how often Watcher.Run looks at the file when WatcherOptions.Interval
// is not set.
const DefaultPollInterval = 5 * time.Second

// WatcherOptions configures a Watcher. The zero value is usable.
type WatcherOptions struct {
	// Interval is how often Run looks at the file; DefaultPollInterval when zero or negative.
	Interval time.Duration
	// Logger receives one record per reload attempt, Info when it succeeded and Error when
	// it failed, and one Error when polling finds the file gone. The records carry the path,
	// the key and tenant counts and the error, never key material. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, when set, is told the same events, under the Watcher's lock (so calls never
	// overlap): the new set and nil, or the set still in use and the error. It suits counting
	// reloads and refreshing metrics; it must not call the Watcher's Reload.
	OnReload func(current *Set, err error)
	// Check, when set, vets every loaded set before it is put in use, by NewWatcher and by
	// every reload: an error fails the load as a malformed file would. The router can refuse
	// priority levels that admission does not know, for example. It must not call the Watcher.
	Check func(*Set) error
}

// Watcher keeps the Set loaded from one keys file current. Its methods are safe for
// concurrent use; Current and Lookup never block.
type Watcher struct {
	path    string
	opts    WatcherOptions
	current atomic.Pointer[Set]

	mu      sync.Mutex  // serializes reloads and polls; guards the fields below
	tried   os.FileInfo // the file as it was at the last reload attempt (nil: unknown)
	seen    os.FileInfo // the file as the last poll saw it (nil: missing or not yet polled)
	missing bool        // the last poll could not stat the file, and said so
}

// ErrNoKey is the error of a first load that found no key in the file.
var ErrNoKey = errors.New("clientkeys: the file holds no key: every client would be refused (401)")

// NewWatcher loads the keys file at path and returns a Watcher holding it. It fails, without
// logging, when the first load fails: the router should not start with a broken keys file, nor
// with one that holds no key (ErrNoKey), which is the wrong file or one not yet written. A
// reload may empty the file: that is how every key is revoked at once.
func NewWatcher(path string, opts WatcherOptions) (*Watcher, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultPollInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &Watcher{path: path, opts: opts}
	s, fi, err := w.load()
	if err != nil {
		return nil, err
	}
	if s.Len() == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoKey, path)
	}
	w.tried, w.seen = fi, fi
	w.current.Store(s)
	return w, nil
}

// Current returns the set in use.
func (w *Watcher) Current() *Set { return w.current.Load() }

// Lookup is Current().Lookup(presentedKey).
func (w *Watcher) Lookup(presentedKey string) (Client, bool) {
	return w.current.Load().Lookup(presentedKey)
}

// Reload loads the file now, whether or not it changed, and returns the error of a failed
// load, after which the previous set stays in use. Call it on SIGHUP.
func (w *Watcher) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reloadLocked(nil)
}

// Run polls the file every Interval until ctx is done, reloading it after a change (see the
// package doc). Run it in its own goroutine; it returns ctx.Err().
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			w.poll()
		}
	}
}

// poll looks at the file once and reloads it when it differs from the last reload attempt
// and has not changed since the previous poll.
func (w *Watcher) poll() {
	fi, err := os.Stat(w.path)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.seen = nil
		if !w.missing { // say so once, not every interval
			w.missing = true
			w.report(err)
		}
		return
	}
	w.missing = false
	settled := sameFile(fi, w.seen)
	w.seen = fi
	if settled && !sameFile(fi, w.tried) {
		w.reloadLocked(fi)
	}
}

// reloadLocked loads the file and, if that succeeds, puts the new set in use. statted is the
// file as the caller saw it, remembered as tried should the load not get as far as its own
// stat. w.mu must be held.
func (w *Watcher) reloadLocked(statted os.FileInfo) error {
	s, fi, err := w.load()
	if fi == nil {
		fi = statted
	}
	w.tried = fi
	if err != nil {
		w.report(err)
		return err
	}
	w.current.Store(s)
	w.report(nil)
	return nil
}

// load loads the file and applies Options.Check.
func (w *Watcher) load() (*Set, os.FileInfo, error) {
	s, fi, err := load(w.path)
	if err == nil && w.opts.Check != nil {
		if err = w.opts.Check(s); err != nil {
			s = nil
		}
	}
	return s, fi, err
}

// report logs the outcome of a reload attempt and passes it to OnReload.
func (w *Watcher) report(err error) {
	s := w.current.Load()
	if err != nil {
		w.opts.Logger.Error("client keys: reload failed, keeping the previous keys",
			"path", w.path, "keys", s.Len(), "err", err)
	} else if s.Len() == 0 {
		w.opts.Logger.Warn("client keys: loaded a file with no key: every client is refused",
			"path", w.path, "keys", 0)
	} else {
		w.opts.Logger.Info("client keys: loaded",
			"path", w.path, "keys", s.Len(), "tenants", len(s.tenants))
	}
	if w.opts.OnReload != nil {
		w.opts.OnReload(s, err)
	}
}

// sameFile reports whether a and b describe the same file with the same size and modification
// time; two nils are the same, a nil and a non-nil are not.
func sameFile(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}
