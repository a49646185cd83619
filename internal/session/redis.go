package session

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Defaults for RedisOptions.
const (
	DefaultKeyPrefix    = "cacheroute"
	DefaultRedisTimeout = 50 * time.Millisecond
)

// RedisOptions configure a Redis store. Zero values take the defaults.
type RedisOptions struct {
	// URL is redis://[user:password@]host:port[/db] or rediss://… (TLS); see ParseRedisURL
	// for the query parameters that select a Cluster or a Sentinel deployment.
	URL string
	// KeyPrefix starts every key: <prefix>:sess2:<model>:<digest of the session key>. Default
	// "cacheroute".
	KeyPrefix string
	// TTL is how long an entry lives after it was last set or read. Default 1h.
	TTL time.Duration
	// Timeout bounds every operation end to end: waiting for a pooled connection, dialing,
	// writing the command and reading the answer. Default 50ms.
	Timeout time.Duration
	// RootCAs, with a rediss:// URL, are the CAs trusted for the server's certificate instead
	// of the system roots. Setting it with a plain redis:// URL is an error.
	RootCAs *x509.CertPool
}

// ApplyDefaults fills zero or negative fields with their defaults.
func (o *RedisOptions) ApplyDefaults() {
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultRedisTimeout
	}
}

// ErrBusy wraps the error of a call that found every connection of the pool in use for the whole
// timeout: the server may be healthy and the router simply busier than its pool.
var ErrBusy = errors.New("session store busy")

// Redis is the shared Store: every router replica pointed at the same Redis (or Valkey) sees
// the same session map. The entry <prefix>:sess2:<model>:<digest> (see Key) holds the worker tenant
// as a plain string with the session TTL as its expiry.
//
//   - Get is one GETEX … PX/EX round trip: it reads the tenant and refreshes the TTL at once
//     (Redis ≥ 6.2, or Valkey).
//   - Set is one synchronous SET … PX/EX, so a replica always reads its own writes.
//   - Delete is one DEL.
//   - RemoveTenantsWithBase does nothing in Redis: a worker's entries are not indexed by
//     worker, and scanning every session key on each removal would cost O(sessions) round
//     trips. The entries are harmless: the policy never routes to a tenant that is not one of
//     its live candidates, deletes the entry when it finds the tenant gone, and overwrites it
//     with the new placement; entries nobody reads expire with the TTL.
//
// There is no local copy in front of Redis: every read goes to Redis. Every call is bounded
// by Timeout, whatever the state of the network or the server; a timed-out call returns an
// error and the caller decides what to do (see Fallback). The client reconnects by itself.
type Redis struct {
	client  redis.UniversalClient
	prefix  string
	ttl     time.Duration
	timeout time.Duration
}

var _ Store = (*Redis)(nil)

// NewRedis returns a store for opts.URL. It does not contact the server: connections are
// made on first use and remade after failures, so a router can start while Redis is down.
func NewRedis(opts RedisOptions) (*Redis, error) {
	opts.ApplyDefaults()
	uo, err := ParseRedisURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.RootCAs != nil {
		if uo.TLSConfig == nil {
			return nil, errors.New("redis url: trusted CAs are given for a redis:// URL, which does not use TLS; use rediss://")
		}
		uo.TLSConfig.RootCAs = opts.RootCAs
	}
	boundTimeouts(uo, opts.Timeout)
	quietClientLogs()
	return &Redis{
		client:  redis.NewUniversalClient(uo),
		prefix:  opts.KeyPrefix,
		ttl:     opts.TTL,
		timeout: opts.Timeout,
	}, nil
}

// boundTimeouts makes every stage of a call give up within timeout, and turns off the client's
// own retries, each of which would start the wait anew.
func boundTimeouts(o *redis.UniversalOptions, timeout time.Duration) {
	// Calls are short, but each one holds a connection for a round trip: allow for bursts.
	o.PoolSize = max(64, 16*runtime.GOMAXPROCS(0))
	o.DialTimeout = timeout
	o.ReadTimeout = timeout
	o.WriteTimeout = timeout
	o.PoolTimeout = timeout
	o.ContextTimeoutEnabled = true // the per-call context deadline also bounds socket I/O
	o.MaxRetries = -1              // no retry inside one call
	o.DialerRetries = 1            // one dial per call; the pool re-dials in the background
	o.PipelinePoolSize = -1        // no pipelines here: no second pool
	o.DisableIdentity = true       // no CLIENT SETINFO round trip on connect
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// Client exposes the underlying client (tests inspect keys and TTLs with it).
func (r *Redis) Client() redis.UniversalClient { return r.client }

// Close releases the connections.
func (r *Redis) Close() error { return r.client.Close() }

// Key returns the Redis key of a session: <prefix>:sess2:<model>:<digest>, the digest being the
// first 16 bytes of the SHA-256 of the session key, in hex. The session key never appears in a key
// name, so listing the keys, a slow log or a monitor does not show clients' session ids. A ':' or
// '%' in the model name is percent-escaped so that no model name can produce another's key; model
// names without them appear as they are. (Keys before the digest were <prefix>:sess:<model>:<session
// key>; nothing reads them, and they expire with the session TTL.)
func (r *Redis) Key(model, key string) string {
	sum := sha256.Sum256([]byte(key))
	var b strings.Builder
	b.Grow(len(r.prefix) + len(":sess2:") + len(model) + 1 + 32)
	b.WriteString(r.prefix)
	b.WriteString(":sess2:")
	if strings.ContainsAny(model, ":%") {
		model = strings.NewReplacer("%", "%25", ":", "%3A").Replace(model)
	}
	b.WriteString(model)
	b.WriteByte(':')
	b.WriteString(hex.EncodeToString(sum[:16]))
	return b.String()
}

func (r *Redis) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// Get returns the tenant for key and refreshes its TTL, in one GETEX.
func (r *Redis) Get(ctx context.Context, model, key string) (tenant.ID, bool, error) {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	worker, err := r.client.GetEx(ctx, r.Key(model, key), r.ttl).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, wrapBusy(err)
	}
	return tenant.ID(worker), true, nil
}

func wrapBusy(err error) error {
	if errors.Is(err, redis.ErrPoolTimeout) {
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return err
}

// Set points key at worker with a fresh TTL, synchronously. The value is the ID's string, as every
// release has written it, so that replicas of different releases read each other's entries.
func (r *Redis) Set(ctx context.Context, model, key string, worker tenant.ID) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return wrapBusy(r.client.Set(ctx, r.Key(model, key), string(worker), r.ttl).Err())
}

// Delete removes key.
func (r *Redis) Delete(ctx context.Context, model, key string) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return wrapBusy(r.client.Del(ctx, r.Key(model, key)).Err())
}

// RemoveTenantsWithBase leaves Redis alone; see the type's documentation for why that is safe.
func (r *Redis) RemoveTenantsWithBase(context.Context, string) error { return nil }

// Ping checks that the server answers, within the timeout.
func (r *Redis) Ping(ctx context.Context) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return wrapBusy(r.client.Ping(ctx).Err())
}

// ParseRedisURL turns a session store URL into client options:
//
//	redis://[user:password@]host[:port][/db]    plain TCP (port 6379 by default, db 0)
//	rediss://…                                 the same over TLS (server name = host)
//
// Query parameters:
//
//	addr=host:port       another seed address (repeatable); two or more addresses make a
//	                     Redis Cluster client
//	cluster=true         a Cluster client even with one address (a configuration endpoint)
//	master_name=NAME     a Sentinel client: the addresses are sentinels, NAME the master
//	sentinel_username=U, sentinel_password=P
//	                     credentials of the sentinels; user and password in the URL are the
//	                     data nodes' credentials
//
// Cluster clients only have db 0. Unknown parameters are an error, so a misspelt one is not
// silently ignored.
func ParseRedisURL(raw string) (*redis.UniversalOptions, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", redactURLError(err))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("redis url: scheme %q, want redis or rediss", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return nil, errors.New("redis url: want redis://[user:password@]host:port[/db]")
	}
	host, addr, err := hostAndAddr(u.Host)
	if err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{Addrs: []string{addr}}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	if u.Scheme == "rediss" {
		o.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 || strings.Contains(db, "/") {
			return nil, fmt.Errorf("redis url: database %q is not a number", db)
		}
		o.DB = n
	}
	q := u.Query()
	for name, values := range q {
		switch name {
		case "addr":
			for _, v := range values {
				_, a, err := hostAndAddr(v)
				if err != nil {
					return nil, err
				}
				o.Addrs = append(o.Addrs, a)
			}
		case "cluster":
			o.IsClusterMode, err = strconv.ParseBool(q.Get(name))
			if err != nil {
				return nil, fmt.Errorf("redis url: cluster=%q is not a boolean", q.Get(name))
			}
		case "master_name":
			o.MasterName = q.Get(name)
		case "sentinel_username":
			o.SentinelUsername = q.Get(name)
		case "sentinel_password":
			o.SentinelPassword = q.Get(name)
		default:
			return nil, fmt.Errorf("redis url: unknown parameter %q", name)
		}
	}
	if o.MasterName == "" && (len(o.Addrs) > 1 || o.IsClusterMode) && o.DB != 0 {
		return nil, fmt.Errorf("redis url: a Redis Cluster has only database 0, not %d", o.DB)
	}
	return o, nil
}

// hostAndAddr splits a URL host into the bare host name (for TLS) and a dialable address with
// the default port filled in.
func hostAndAddr(hostport string) (host, addr string, err error) {
	u := url.URL{Host: hostport}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return "", "", fmt.Errorf("redis url: address %q has no host", hostport)
	}
	if port == "" {
		port = "6379"
	} else if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("redis url: address %q has a bad port", hostport)
	}
	return host, net.JoinHostPort(host, port), nil
}

// redactURLError drops the URL itself from a parse error, so a password never reaches a log.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

var quietOnce sync.Once

// quietClientLogs sends the client library's own messages (one per failed dial during an
// outage) to the default slog logger at debug level; the Fallback store reports failures
// itself, at most once per second.
func quietClientLogs() {
	quietOnce.Do(func() { redis.SetLogger(debugLogger{}) })
}

type debugLogger struct{}

func (debugLogger) Printf(ctx context.Context, format string, v ...any) {
	if slog.Default().Enabled(ctx, slog.LevelDebug) {
		slog.Default().DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
	}
}
