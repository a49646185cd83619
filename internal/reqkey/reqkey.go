// Package reqkey derives the routing keys of a request that know no protocol: the session key of
// exact session affinity and the key of the hash policies, from the request's headers and from the
// ids its protocol read in its body (package protocol reads them, and calls SessionKey and
// HashKey). Everything here is a pure function of its arguments.
package reqkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxIDLen is the longest session id kept verbatim; longer ids are stored as a hash.
const MaxIDLen = 256

// Session id sources, in precedence order. Header names are matched case-insensitively.
var (
	// SessionHeaders carry a session-scoped id (after the body's session_params.session_id).
	SessionHeaders = []string{"x-session-id", "x-claude-code-session-id", "x-session-affinity", "session-id", "session_id"}
	// UserHeader carries a user-scoped id.
	UserHeader = "x-user-id"
	// HashKeyHeaders are read, in order, by the hash policies.
	HashKeyHeaders = []string{"x-session-id", "x-user-id", "x-tenant-id", "x-correlation-id", "x-request-id", "x-trace-id"}
)

// Header is what the keys read of the request's headers: http.Header, or an adapter over another
// HTTP stack's headers. Get matches names case-insensitively and returns "" when absent. A nil
// Header has none.
type Header interface {
	Get(key string) string
}

// noHeaders is the nil Header's.
type noHeaders struct{}

func (noHeaders) Get(string) string { return "" }

// SessionKey is "session:<id>" or "user:<id>" from the first non-blank source, or empty: first
// (the body's session_params.session_id), the session headers, the body's other session-scoped
// ids in order, then the user-scoped x-user-id header and the body's user-scoped ids in order.
// Ids longer than MaxIDLen are replaced by a fixed-size hash.
func SessionKey(h Header, first string, sessions, users []string) string {
	if h == nil {
		h = noHeaders{}
	}
	if v := blankless(first); v != "" {
		return namespaced("session:", v)
	}
	for _, name := range SessionHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return namespaced("session:", v)
		}
	}
	for _, v := range sessions {
		if v := blankless(v); v != "" {
			return namespaced("session:", v)
		}
	}
	if v := blankless(h.Get(UserHeader)); v != "" {
		return namespaced("user:", v)
	}
	for _, v := range users {
		if v := blankless(v); v != "" {
			return namespaced("user:", v)
		}
	}
	return ""
}

// HashKey is the key of the consistent_hash and rendezvous_hash policies: the first id in
// HashKeyHeaders, then the first of the body's ids, else text (the history key or routing text).
func HashKey(h Header, ids []string, text string) string {
	if h == nil {
		h = noHeaders{}
	}
	for _, name := range HashKeyHeaders {
		if v := blankless(h.Get(name)); v != "" {
			return v
		}
	}
	for _, v := range ids {
		if s := blankless(v); s != "" {
			return s
		}
	}
	return text
}

func blankless(s string) string { return strings.TrimSpace(s) }

func namespaced(kind, v string) string {
	if len(v) <= MaxIDLen {
		return kind + v
	}
	sum := sha256.Sum256([]byte(v))
	return kind + "sha256:" + hex.EncodeToString(sum[:16])
}

// BytesPerToken is the rough number of bytes of request text per prompt token, for the estimates
// made without a tokenizer: the token rate limit, the prefill an attempt weighs in the tokens
// load signal, and what a prefix match saves in cache_aware's cost mode.
const BytesPerToken = 4
