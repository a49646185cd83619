package tenant

// URL is a worker's identity: a worker URL that NormalizeURL accepted, in its canonical form. It
// is built once, by ParseURL, where a URL enters the router (a flag, the admin API, a discovery
// source), and passed on as it is, so no later step normalises or checks it again; the zero URL
// names no worker.
type URL struct{ s string }

// ParseURL checks and normalises raw (see NormalizeURL) into a worker's identity.
func ParseURL(raw string) (URL, error) {
	s, err := NormalizeURL(raw)
	if err != nil {
		return URL{}, err
	}
	return URL{s}, nil
}

// String is the normalised URL, credentials included: the key of the pool, the policy's state and
// the connections. Show Redacted instead.
func (u URL) String() string { return u.s }

// Redacted is the URL without its user:password@, the only form shown outside the router.
func (u URL) Redacted() string { return Redact(u.s) }

// HasCredentials reports whether the URL carries user:password@ (or a user name alone).
func (u URL) HasCredentials() bool { return Redact(u.s) != u.s }

// IsZero reports whether u names no worker.
func (u URL) IsZero() bool { return u.s == "" }
