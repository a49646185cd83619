// Package clientkeys decides which clients may use the router: it loads a file of client API
// keys, answers whether a presented key is one of them and, if so, which tenant and priority it
// carries, and keeps the loaded set current as the file changes. It has no HTTP in it: the
// server passes in a header getter (FromHeaders) and acts on the answer of Lookup.
//
// # The keys file
//
// The file is UTF-8 text, read line by line ("\n" or "\r\n" endings; a leading byte-order mark
// is ignored). Blank lines, and lines whose first non-blank character is '#', are skipped.
// Every other line is one entry: fields separated by spaces or tabs, the first being the key
// and the others optional settings, in any order, each at most once:
//
//	# comment
//	<key>     [tenant=<name>] [priority=<level>] [# comment]
//	sha256:<64 hex digits> [tenant=<name>] [priority=<level>] [# comment]
//
// where:
//
//   - <key> is the key as clients send it: one or more printable ASCII characters (0x21–0x7E),
//     not starting with '#' and not starting with "sha256:", "tenant=" or "priority=".
//   - sha256:<hex> names a key by the SHA-256 digest of its bytes, in 64 hex digits of either
//     case (what `printf %s "$KEY" | sha256sum` prints), so the file need not hold the key.
//     The digest of the empty string is refused (an empty key is never accepted).
//   - tenant=<name> and priority=<level>: <name> and <level> match [A-Za-z0-9_.-]{1,64}, so
//     both are safe, bounded Prometheus label values. A key without tenant= belongs to the
//     tenant DefaultTenant ("default"); a key without priority= has the Priority "", which
//     leaves the choice to whoever applies priorities.
//   - A field starting with '#' after the key ends the line (a trailing comment).
//
// The same key may appear only once, whether written plainly or as a digest. A file with no
// entries is valid and accepts no key. Any malformed line fails the whole file with a
// *ParseError naming the file and line number. Error messages never quote the line's text, so
// a key (or a key pasted by mistake into the tenant= field) never reaches a log.
//
// # Keeping keys secret
//
// A Set stores only the SHA-256 digest of each key, never the key. Load reads the file into
// one buffer, parses it in place and zeroes the buffer before returning, so plaintext keys
// live in the process only while the file is parsed (best effort: the kernel's page cache and
// the caller's own copies are out of reach).
//
// Lookup hashes the presented key once and looks the digest up in a map. It does not compare
// against each stored digest in constant time, and need not: whatever a timing difference of
// the map could reveal (how the presented key's digest relates to the stored digests; the
// map's bucket choice is seeded per process) is information about digests, and knowing a
// digest does not help an attacker produce a key that hashes to it (that needs a SHA-256
// preimage). The key itself is never compared byte by byte. A map keeps Lookup O(1) in the
// number of keys, where a constant-time scan over every entry would be O(n).
//
// # Reloading
//
// A Watcher holds the current *Set in an atomic pointer: Lookup never takes a lock and never
// waits for a reload. Watcher.Run polls the file (its identity, size and modification time,
// via os.Stat) every WatcherOptions.Interval and reloads it once a change has stayed the same
// for one whole interval, so a file caught halfway through being rewritten is not loaded;
// a change is therefore picked up one to two intervals after it happened. Watcher.Reload
// reloads at once, whatever the file's state (the router calls it on SIGHUP). A reload that
// fails keeps the previous set, logs the error and passes it to WatcherOptions.OnReload.
// Replacing the file by renaming a new one over it is the safest way to update it; a rewrite
// in place that keeps the same size within the file system's clock granularity may go
// unnoticed by polling, and Reload covers that case.
package clientkeys
