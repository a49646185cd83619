package kubeapi

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Selector is an equality-based label selector: every key must be present with its value.
type Selector map[string]string

// ParseSelector reads "k=v,k2=v2". It refuses an empty selector, which would match every pod of
// the namespace, and anything but key=value terms (set-based terms, "!=", "==").
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("an empty selector would match every pod of the namespace")
	}
	sel := Selector{}
	for term := range strings.SplitSeq(s, ",") {
		term = strings.TrimSpace(term)
		key, value, ok := strings.Cut(term, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" || strings.ContainsAny(key, "!=() ") || strings.ContainsAny(value, "!=(), ") {
			return nil, fmt.Errorf("selector %q: %q is not a key=value term", s, term)
		}
		if prev, dup := sel[key]; dup && prev != value {
			return nil, fmt.Errorf("selector %q: %q wants two values", s, key)
		}
		sel[key] = value
	}
	return sel, nil
}

// Matches reports whether labels carry every key of s with its value.
func (s Selector) Matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// String is s in the API server's form, keys sorted: "app=vllm,tier=gpu".
func (s Selector) String() string {
	terms := make([]string, 0, len(s))
	for _, k := range slices.Sorted(maps.Keys(s)) {
		terms = append(terms, k+"="+s[k])
	}
	return strings.Join(terms, ",")
}
