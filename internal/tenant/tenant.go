// Package tenant names routing targets. A worker URL is one tenant, or with data parallelism one
// tenant per rank, "URL@rank". The policy state (prefix tree, session map) is keyed by tenant,
// and removing a worker removes every tenant of its URL.
package tenant

import (
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
