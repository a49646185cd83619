// Package tenant owns a worker's identity: it checks and normalises worker URLs, names routing
// targets (ID) and redacts credentials from every name shown outside the router. A worker URL is
// one tenant, or with data parallelism one tenant per rank, "URL@rank". Everything kept per worker
// (prefix tree, KV-event index, session store, residency, TTFT predictor) is keyed by its ID,
// and removing a worker removes every tenant of its URL.
package tenant

import (
	"fmt"
	"net/netip"
	"net/url"
	"path"
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

// NormalizeURL is the one place a worker URL given by a user (flag, config file, admin API,
// discovery) is checked and put in canonical form, so that every spelling of one worker is one
// worker: it must be an absolute http or https URL with a host (an IP address or a host name,
// IsHostName), a port from 1 to 65535 if any, and no query or fragment; then
//
//   - surrounding spaces are removed, and the scheme and a host name are lower-cased;
//   - an IP address is written in its canonical form ("[0:0::1]" → "[::1]", an IPv4-mapped IPv6
//     address as IPv4);
//   - the scheme's default port (80 for http, 443 for https) is left out, and leading zeros of a
//     port;
//   - the path is cleaned ("/x/../" → "", "//a/./b/" → "/a/b") and written with the standard
//     percent-encoding, and a trailing slash removed.
//
// The result is the worker's identity everywhere (pool, prefix tree, session map, header values,
// metric labels), so "http://H:80/x/../" and "http://h" are one worker. Names are not resolved
// here: "localhost" and "127.0.0.1" stay two spellings, which the fleet recognises as one
// worker when they join (Loopback).
//
// A URL whose path ends in /v1 (the OpenAI base URL a client is configured with) is refused with
// a message naming the URL to give instead: the router appends /v1/chat/completions, /health and
// the other paths itself, so such a worker would be probed at /v1/health and never come up. It is
// refused rather than silently trimmed so that the configured URL stays the worker's name in
// every header, metric label and log line, and so that a warning cannot scroll by unseen.
func NormalizeURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("malformed worker URL %q: %v", Redact(raw), err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" || u.RawQuery != "" || u.ForceQuery ||
		u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("malformed worker URL %q: want http(s)://host[:port][/path]", Redact(raw))
	}
	if _, err := netip.ParseAddr(u.Hostname()); err != nil && !IsHostName(u.Hostname()) {
		return "", fmt.Errorf("malformed worker URL %q: %q is neither an IP address nor a host name", Redact(raw), u.Hostname())
	}
	port := u.Port()
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return "", fmt.Errorf("malformed worker URL %q: port %s is not from 1 to 65535", Redact(raw), port)
		}
		port = strconv.FormatUint(n, 10)
		if port == map[string]string{"http": "80", "https": "443"}[u.Scheme] {
			port = ""
		}
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil && u.User.String() != "" {
		b.WriteString(u.User.String() + "@")
	}
	b.WriteString(canonicalHost(u.Hostname()))
	if port != "" {
		b.WriteString(":" + port)
	}
	p := ""
	if u.Path != "" {
		p = strings.TrimSuffix(path.Clean("/"+u.Path), "/")
	}
	b.WriteString((&url.URL{Path: p}).EscapedPath())
	s := b.String()
	if len(p) >= 3 && strings.EqualFold(p[len(p)-3:], "/v1") {
		base := s[:len(s)-3]
		return "", fmt.Errorf("worker URL %q ends in /v1: give the server's base URL %q instead (the router adds /v1/chat/completions and the other API paths itself)",
			Redact(s), Redact(base))
	}
	return s, nil
}

// IsHostName reports whether h is a DNS host name: dot-separated labels of 1 to 63 letters,
// digits, hyphens and underscores, none starting or ending with a hyphen, 253 bytes at most, and
// an optional final dot.
func IsHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// canonicalHost writes a URL's host: an IP address in its canonical form (IPv6 in brackets, its
// zone escaped), a name lower-cased.
func canonicalHost(h string) string {
	a, err := netip.ParseAddr(h)
	if err != nil {
		return strings.ToLower(h)
	}
	a = a.Unmap()
	if !a.Is6() {
		return a.String()
	}
	zone := a.Zone()
	if zone == "" {
		return "[" + a.String() + "]"
	}
	return "[" + a.WithZone("").String() + "%25" + url.PathEscape(zone) + "]"
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
