package config

import (
	"slices"
	"strings"
)

// urlList is the pflag value of --worker-urls. It accepts a comma-separated list and repeated
// flags; the first Set replaces whatever the list held before (a default or the config file), later
// ones append. ExpandSpaceSeparated turns the vLLM router's space-separated form into repeats.
type urlList struct {
	list *[]string
	set  bool
}

func (u *urlList) String() string {
	if u.list == nil {
		return ""
	}
	return strings.Join(*u.list, ",")
}

func (u *urlList) Set(v string) error {
	if !u.set {
		*u.list = nil
		u.set = true
	}
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*u.list = append(*u.list, part)
		}
	}
	return nil
}

func (u *urlList) Type() string { return "urls" }

// ExpandSpaceSeparated rewrites `--worker-urls a b c` (the vLLM router's form, where the values
// follow the flag as separate arguments) into `--worker-urls a --worker-urls b --worker-urls c`, so
// that the ordinary flag parser understands it. Every following argument that is not a flag and
// not one of stopWords (the subcommand names) is taken as a further value, so a malformed value
// is reported by validation under the flag's name. Arguments after "--" are left alone.
func ExpandSpaceSeparated(args []string, flag string, stopWords ...string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		if a != "--"+flag {
			continue
		}
		if i+1 < len(args) { // the flag's own value, whatever it looks like
			out = append(out, args[i+1])
			i++
		}
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && !slices.Contains(stopWords, args[i+1]) {
			out = append(out, "--"+flag, args[i+1])
			i++
		}
	}
	return out
}
