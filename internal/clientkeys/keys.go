package clientkeys

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
)

// DefaultTenant is the tenant of a key whose line has no tenant= setting.
const DefaultTenant = "default"

// maxNameLen bounds tenant names and priority levels, which become metric label values.
const maxNameLen = 64

const digestPrefix = "sha256:"

// Client is what a valid key says about the caller who presented it.
type Client struct {
	Tenant   string // a name matching [A-Za-z0-9_.-]{1,64}; DefaultTenant when the file names none
	Priority string // a level matching [A-Za-z0-9_.-]{1,64}, or "" when the file names none
}

// Set is an immutable set of client keys, held as SHA-256 digests. The zero value and the nil
// *Set accept no key. A Set is safe for concurrent use.
type Set struct {
	byDigest   map[[sha256.Size]byte]Client
	tenants    []string // sorted, distinct
	priorities []string // sorted, distinct, without ""
}

// Lookup reports whether presentedKey is one of the set's keys and, if so, its client. The
// empty key is never accepted.
func (s *Set) Lookup(presentedKey string) (Client, bool) {
	if s == nil || presentedKey == "" {
		return Client{}, false
	}
	c, ok := s.byDigest[digestOfString(presentedKey)]
	return c, ok
}

// digestOfString returns the SHA-256 digest of key without allocating for keys of up to 512
// bytes (which covers the keys of common providers, 200 bytes at most): the conversion of a
// longer string to []byte would otherwise allocate on every lookup.
func digestOfString(key string) [sha256.Size]byte {
	var buf [512]byte
	if len(key) <= len(buf) {
		return sha256.Sum256(append(buf[:0], key...))
	}
	return sha256.Sum256([]byte(key))
}

// Len returns the number of keys in the set.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byDigest)
}

// Tenants returns the distinct tenant names of the set's keys, sorted: every value
// Client.Tenant can take for this set. The caller may modify the returned slice.
func (s *Set) Tenants() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.tenants)
}

// Priorities returns the distinct priority levels named in the file, sorted. Client.Priority
// is one of them or "". The caller may modify the returned slice.
func (s *Set) Priorities() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.priorities)
}

// ParseError is a malformed line of a keys file. Its message never quotes the line.
type ParseError struct {
	Path   string // the file, as given to Load or Parse
	Line   int    // 1-based
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("clientkeys: %s:%d: %s", e.Path, e.Line, e.Reason)
}

// Load reads and parses the keys file at path (see the package doc for its format). The
// buffer the file was read into is zeroed before Load returns.
func Load(path string) (*Set, error) {
	s, _, err := load(path)
	return s, err
}

// load is Load that also returns the file's FileInfo, taken from the descriptor it read, or
// nil when the file could not be opened.
func load(path string) (*Set, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("clientkeys: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("clientkeys: %w", err)
	}
	data, err := readAllWiping(f, fi.Size())
	defer clear(data)
	if err != nil {
		return nil, fi, fmt.Errorf("clientkeys: reading %s: %w", path, err)
	}
	s, err := Parse(path, data)
	return s, fi, err
}

// readAllWiping reads r to its end into a buffer sized for sizeHint bytes. Should the data
// outgrow it, the buffer it leaves behind is zeroed, so no stray copy of the data is left.
func readAllWiping(r io.Reader, sizeHint int64) ([]byte, error) {
	buf := make([]byte, 0, max(sizeHint, 0)+1) // +1: EOF is seen without growing
	for {
		if len(buf) == cap(buf) {
			buf = growWiping(buf)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// growWiping returns a copy of buf with twice its capacity, and zeroes buf.
func growWiping(buf []byte) []byte {
	bigger := make([]byte, len(buf), 2*cap(buf)+1)
	copy(bigger, buf)
	clear(buf[:cap(buf)])
	return bigger
}

// Parse parses the contents of a keys file; path is used in error messages only. Parse does
// not keep or modify data; zeroing it afterwards is the caller's choice.
func Parse(path string, data []byte) (*Set, error) {
	data = bytes.TrimPrefix(data, []byte("\uFEFF"))
	byDigest := make(map[[sha256.Size]byte]Client)
	lineOf := make(map[[sha256.Size]byte]int)
	tenants := make(map[string]string) // interned: one string per distinct name
	priorities := make(map[string]string)
	for n := 1; len(data) > 0; n++ {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte{'\n'})
		fields := bytes.FieldsFunc(line, isBlank)
		if len(fields) == 0 || fields[0][0] == '#' {
			continue
		}
		fail := func(format string, args ...any) error {
			return &ParseError{Path: path, Line: n, Reason: fmt.Sprintf(format, args...)}
		}
		digest, reason := entryDigest(fields[0])
		if reason != "" {
			return nil, fail("%s", reason)
		}
		c := Client{Tenant: DefaultTenant}
		var hasTenant, hasPriority bool
		for i, f := range fields[1:] {
			if f[0] == '#' {
				break
			}
			name, value, _ := bytes.Cut(f, []byte{'='})
			switch string(name) {
			case "tenant":
				if hasTenant {
					return nil, fail("tenant= given twice")
				}
				if !validName(value) {
					return nil, fail("field %d: tenant name must match [A-Za-z0-9_.-]{1,%d}", i+2, maxNameLen)
				}
				hasTenant, c.Tenant = true, intern(tenants, value)
			case "priority":
				if hasPriority {
					return nil, fail("priority= given twice")
				}
				if !validName(value) {
					return nil, fail("field %d: priority level must match [A-Za-z0-9_.-]{1,%d}", i+2, maxNameLen)
				}
				hasPriority, c.Priority = true, intern(priorities, value)
			default:
				return nil, fail("field %d: want tenant=NAME, priority=LEVEL or a # comment after the key", i+2)
			}
		}
		if first, dup := lineOf[digest]; dup {
			return nil, fail("duplicate key (first on line %d)", first)
		}
		lineOf[digest] = n
		if !hasTenant {
			intern(tenants, []byte(DefaultTenant))
		}
		byDigest[digest] = c
	}
	s := &Set{byDigest: byDigest}
	for name := range tenants {
		s.tenants = append(s.tenants, name)
	}
	for level := range priorities {
		s.priorities = append(s.priorities, level)
	}
	slices.Sort(s.tenants)
	slices.Sort(s.priorities)
	return s, nil
}

// emptyDigest is the SHA-256 digest of "", refused as an entry since no key may be empty.
var emptyDigest = sha256.Sum256(nil)

// entryDigest returns the digest an entry's first field stands for, or why it stands for none.
func entryDigest(field []byte) (digest [sha256.Size]byte, reason string) {
	if hexDigits, ok := bytes.CutPrefix(field, []byte(digestPrefix)); ok {
		if len(hexDigits) != 2*sha256.Size {
			return digest, "a sha256: entry needs exactly 64 hex digits"
		}
		if _, err := hex.Decode(digest[:], hexDigits); err != nil {
			return digest, "a sha256: entry needs exactly 64 hex digits"
		}
		if digest == emptyDigest {
			return digest, "the sha256: entry is the digest of the empty key, which is never accepted"
		}
		return digest, ""
	}
	if bytes.HasPrefix(field, []byte("tenant=")) || bytes.HasPrefix(field, []byte("priority=")) {
		return digest, "the key is missing: a line starts with the key, then tenant= or priority="
	}
	for _, b := range field {
		if b < 0x21 || b > 0x7e {
			return digest, "the key has a byte outside printable ASCII (0x21-0x7E)"
		}
	}
	return sha256.Sum256(field), ""
}

// isBlank reports whether r separates fields on a line.
func isBlank(r rune) bool {
	return r == ' ' || r == '\t' || r == '\r' || r == '\v' || r == '\f'
}

// validName reports whether b matches [A-Za-z0-9_.-]{1,maxNameLen}.
func validName(b []byte) bool {
	if len(b) == 0 || len(b) > maxNameLen {
		return false
	}
	for _, c := range b {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// intern returns the string in names equal to b, adding it first if it is new.
func intern(names map[string]string, b []byte) string {
	if s, ok := names[string(b)]; ok {
		return s
	}
	s := string(b)
	names[s] = s
	return s
}
