// Package tenant owns a worker's identity: it checks and normalises worker URLs, names routing
// targets and redacts credentials from every name shown outside the router. A worker URL is one
// tenant, or with data parallelism one tenant per rank, "URL@rank". The policy state (prefix tree, session map) is keyed by tenant,
// and removing a worker removes every tenant of its URL.
package tenant

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Name is url without data parallelism (rank < 0) and "url@rank" with it.
func Name(url string, rank int) string {
	if rank < 0 {
		return url
	}
	return url + "@" + strconv.Itoa(rank)
}

// Base returns the worker URL of a tenant name ("URL@3" → "URL"); a name without a rank suffix is
// its own base.
func Base(name string) string {
	if i := strings.LastIndexByte(name, '@'); i > 0 && isRank(name[i+1:]) {
		return name[:i]
	}
	return name
}

// HasBase reports whether name is base itself or base followed by "@" and a decimal rank: the
// tenants to forget when the worker at base is removed.
func HasBase(name, base string) bool {
	rest, ok := strings.CutPrefix(name, base)
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	rank, ok := strings.CutPrefix(rest, "@")
	return ok && isRank(rank)
}

func isRank(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return s != "" && err == nil
}

// NormalizeURL is the one place a worker URL given by a user (flag, config file, admin API) is
// checked and put in canonical form: surrounding spaces and trailing slashes removed; then it must
// be an absolute http or https URL with a host and no query or fragment. The result is the
// worker's identity everywhere (pool, prefix tree, session map), so "http://h:8000/" and
// "http://h:8000" are one worker.
//
// A URL whose path ends in /v1 (the OpenAI base URL a client is configured with) is refused with
// a message naming the URL to give instead: the router appends /v1/chat/completions, /health and
// the other paths itself, so such a worker would be probed at /v1/health and never come up. It is
// refused rather than silently trimmed so that the configured URL stays the worker's name in
// every header, metric label and log line, and so that a warning cannot scroll by unseen.
func NormalizeURL(raw string) (string, error) {
	s := strings.TrimRight(strings.TrimSpace(raw), "/")
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("malformed worker URL %q: %v", Redact(raw), err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("malformed worker URL %q: want http(s)://host[:port][/path]", Redact(raw))
	}
	if u.Path != "" && len(s) > 3 && strings.EqualFold(s[len(s)-3:], "/v1") { // no query or fragment: the path ends s
		base := s[:len(s)-3]
		return "", fmt.Errorf("worker URL %q ends in /v1: give the server's base URL %q instead (the router adds /v1/chat/completions and the other API paths itself)",
			Redact(s), Redact(base))
	}
	return s, nil
}

// Redact returns a tenant name or worker URL without its userinfo ("http://user:pw@h:1@2" →
// "http://h:1@2"), the only form shown to clients, logs, metric labels and health output: worker
// credentials never leave the router.
func Redact(name string) string {
	base := Base(name)
	rank := name[len(base):]
	scheme := strings.Index(base, "://")
	if scheme < 0 {
		return name
	}
	hostStart := scheme + 3
	end := len(base)
	if i := strings.IndexAny(base[hostStart:], "/?#"); i >= 0 {
		end = hostStart + i
	}
	at := strings.LastIndexByte(base[hostStart:end], '@')
	if at < 0 {
		return name
	}
	return base[:hostStart] + base[hostStart+at+1:] + rank
}
