// Package telemetry holds what the router tells about each request beyond its metrics: the access
// log (one JSON line per routed request).
package telemetry

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Entry is one routed request in the access log. Optional fields are left out when unknown.
type Entry struct {
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Route     string    `json:"route"`
	Method    string    `json:"method"`
	Model     string    `json:"model,omitempty"`
	Tenant    string    `json:"tenant,omitempty"`
	// Session is a short hash of the session key, never the key: it tells a session's requests
	// apart without revealing its id.
	Session  string `json:"session,omitempty"`
	Decision string `json:"decision,omitempty"`
	Worker   string `json:"worker,omitempty"`
	// PD is the path a request took under prefill/decode disaggregation, and PrefillWorker the
	// worker that prefilled it when its KV was transferred.
	PD            string `json:"pd,omitempty"`
	PrefillWorker string `json:"prefill_worker,omitempty"`
	Status        int    `json:"status"`
	// StatusClass is what requests_total counts: 2xx … 5xx, or cut for an answer that broke off.
	StatusClass  string  `json:"status_class"`
	Attempts     int     `json:"attempts"`
	TTFBSeconds  float64 `json:"ttfb_seconds,omitempty"`
	Seconds      float64 `json:"duration_seconds"`
	BytesIn      int     `json:"bytes_in"`
	BytesOut     int64   `json:"bytes_out"`
	PromptTokens *int    `json:"prompt_tokens,omitempty"`
	CachedTokens *int    `json:"cached_tokens,omitempty"`
}

// SessionHash identifies a session key in logs and traces without revealing it; "" for no key.
// It is a keyed hash (HMAC-SHA-256, its first 6 bytes in hex) under the salt of SetSessionSalt,
// or else a random salt drawn when the process starts: without the salt, a session id that can
// be guessed cannot be confirmed by hashing it and looking for the result in a log.
func SessionHash(key string) string {
	if key == "" {
		return ""
	}
	mac := hmac.New(sha256.New, *sessionSalt.Load())
	mac.Write([]byte(key))
	return hex.EncodeToString(mac.Sum(nil)[:6])
}

// sessionSalt is the key of SessionHash.
var sessionSalt atomic.Pointer[[]byte]

func init() {
	salt := make([]byte, 32)
	_, _ = rand.Read(salt) // never fails (crypto/rand)
	sessionSalt.Store(&salt)
}

// SetSessionSalt makes SessionHash use salt from now on, so that routers given the same salt
// (--session-hash-salt) write the same hash for a session; "" keeps the process's random salt.
func SetSessionSalt(salt string) {
	if salt == "" {
		return
	}
	b := []byte(salt)
	sessionSalt.Store(&b)
}

// AccessLog writes entries as JSON lines, off the request path: Log hands an entry to a bounded
// queue and returns at once; one goroutine encodes and writes. When the queue is full (the
// destination is slower than the traffic) the entry is dropped and counted rather than making a
// request wait.
type AccessLog struct {
	entries chan Entry
	dropped func()
	done    chan struct{}
	once    sync.Once
}

// AccessLogQueue is how many entries may wait to be written.
const AccessLogQueue = 8192

// accessLogFlush bounds how long a written entry may sit in the buffer.
const accessLogFlush = time.Second

// NewAccessLog starts writing entries to w. dropped, if not nil, is called for each entry dropped.
func NewAccessLog(w io.Writer, dropped func()) *AccessLog {
	l := &AccessLog{entries: make(chan Entry, AccessLogQueue), dropped: dropped, done: make(chan struct{})}
	go l.write(w)
	return l
}

// Log queues e to be written; it never blocks.
func (l *AccessLog) Log(e Entry) {
	select {
	case l.entries <- e:
	default:
		if l.dropped != nil {
			l.dropped()
		}
	}
}

// Close writes the queued entries and stops; Log must not be called after it.
func (l *AccessLog) Close() {
	l.once.Do(func() { close(l.entries) })
	<-l.done
}

func (l *AccessLog) write(w io.Writer) {
	defer close(l.done)
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	tick := time.NewTicker(accessLogFlush)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-l.entries:
			if !ok {
				_ = bw.Flush()
				return
			}
			_ = enc.Encode(e)
			if len(l.entries) == 0 {
				_ = bw.Flush() // nothing more waiting: let the line out now
			}
		case <-tick.C:
			_ = bw.Flush()
		}
	}
}
