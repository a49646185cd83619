package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// urlList is the pflag value of --worker-urls, --prefill and --decode. It accepts a
// comma-separated list and repeated flags; the first Set replaces whatever the list held before
// (a default or the config file), later ones append. ExpandSpaceSeparated turns the vLLM
// router's space-separated form into repeats.
type urlList struct {
	list *[]string
	set  bool
	// bootstrap, when set (--prefill), takes the vLLM router's bootstrap port after a URL
	// (`--prefill URL 9000`, `--prefill URL none`): a value that is a port number or "none" is
	// the previous URL's port, recorded here as BootstrapPort, not taken for a URL.
	bootstrap *[]BootstrapPort
}

// BootstrapPort is a bootstrap port given after a --prefill URL, as the vLLM router takes it.
// vLLM's NIXL transfer, the one the router speaks, needs none: it is reported at start and
// otherwise unused.
type BootstrapPort struct{ URL, Port string }

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
		part = strings.TrimSpace(part)
		switch {
		case part == "":
		case u.bootstrap != nil && isBootstrapPort(part):
			if len(*u.list) == 0 {
				return fmt.Errorf("bootstrap port %q follows no URL (the form is --prefill URL [PORT|none])", part)
			}
			if !strings.EqualFold(part, "none") {
				*u.bootstrap = append(*u.bootstrap, BootstrapPort{URL: (*u.list)[len(*u.list)-1], Port: part})
			}
		default:
			*u.list = append(*u.list, part)
		}
	}
	return nil
}

// isBootstrapPort reports whether v is what the vLLM router takes for a bootstrap port after a
// --prefill URL: a port number, or "none" in any letter case.
func isBootstrapPort(v string) bool {
	if strings.EqualFold(v, "none") {
		return true
	}
	n, err := strconv.Atoi(v)
	return err == nil && n >= 0 && n <= 65535 && v[0] != '+' && v[0] != '-'
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
