package session_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

const (
	redisModel = "llama-3-8b"
	tenantA    = "http://10.0.0.1:8000"
	tenantB    = "http://10.0.0.2:8000@1"
)

func newRedis(t *testing.T, srv *redistest.Server, opts session.RedisOptions) *session.Redis {
	t.Helper()
	opts.URL = srv.URL()
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second // generous: these tests are about behaviour, not speed
	}
	r, err := session.NewRedis(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func mustGet(t *testing.T, s session.Store, model, key string, want tenant.ID) {
	t.Helper()
	got, ok, err := s.Get(context.Background(), model, key)
	if err != nil {
		t.Fatalf("Get(%q, %q): %v", model, key, err)
	}
	if want == "" && ok {
		t.Fatalf("Get(%q, %q) = %q, want a miss", model, key, got)
	}
	if want != "" && (!ok || got != want) {
		t.Fatalf("Get(%q, %q) = (%q, %v), want %q", model, key, got, ok, want)
	}
}

func mustSet(t *testing.T, s session.Store, model, key string, worker tenant.ID) {
	t.Helper()
	if err := s.Set(context.Background(), model, key, worker); err != nil {
		t.Fatalf("Set(%q, %q, %q): %v", model, key, worker, err)
	}
}

func TestRedis_SetGetOverwriteDelete(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{})
	ctx := context.Background()

	mustGet(t, r, redisModel, "session:a", "")
	mustSet(t, r, redisModel, "session:a", tenantA)
	mustGet(t, r, redisModel, "session:a", tenantA)
	mustGet(t, r, "other-model", "session:a", "") // per model
	mustSet(t, r, redisModel, "session:a", tenantB)
	mustGet(t, r, redisModel, "session:a", tenantB)
	if err := r.Delete(ctx, redisModel, "session:a"); err != nil {
		t.Fatal(err)
	}
	mustGet(t, r, redisModel, "session:a", "")
	if err := r.Delete(ctx, redisModel, "session:missing"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
}

// Two stores on one server are two router replicas: each reads the other's writes at once.
func TestRedis_ReplicasShareEntries(t *testing.T) {
	srv := redistest.Start(t)
	a := newRedis(t, srv, session.RedisOptions{})
	b := newRedis(t, srv, session.RedisOptions{})
	mustSet(t, a, redisModel, "user:42", tenantA)
	mustGet(t, b, redisModel, "user:42", tenantA)
	mustSet(t, b, redisModel, "user:42", tenantB)
	mustGet(t, a, redisModel, "user:42", tenantB)
}

func TestRedis_KeyLayout(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{KeyPrefix: "prod"})
	c := srv.Client()
	ctx := context.Background()

	mustSet(t, r, redisModel, "session:abc", tenantA)
	want := "prod:sess2:llama-3-8b:" + digest("session:abc")
	if got, err := c.Get(ctx, want).Result(); err != nil || got != tenantA {
		t.Fatalf("key %s = %q, %v; want %q", want, got, err, tenantA)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v; want exactly one", keys, err)
	}
	// The value is the worker's ID as it is, credentials included: what every release writes and
	// reads, so that replicas of two releases share the entries while a fleet is upgraded.
	const withCredentials = "http://user:pw@10.0.0.3:8000@1"
	if err := c.Set(ctx, r.Key(redisModel, "session:old"), withCredentials, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	mustGet(t, r, redisModel, "session:old", withCredentials)

	// A ':' in the model name is escaped, so model "m:x" and model "m" with the same key are
	// different entries.
	mustSet(t, r, "m:x", "session:x", tenantA)
	mustSet(t, r, "m", "session:x", tenantB)
	mustGet(t, r, "m:x", "session:x", tenantA)
	mustGet(t, r, "m", "session:x", tenantB)
	if got := r.Key("qwen:7b%", "user:u"); got != "prod:sess2:qwen%3A7b%25:"+digest("user:u") {
		t.Fatalf("Key = %q", got)
	}

	def := newRedis(t, srv, session.RedisOptions{})
	if got := def.Key("m", "session:x"); got != "cacheroute:sess2:m:"+digest("session:x") {
		t.Fatalf("default prefix: Key = %q", got)
	}
}

// digest is the part of a key that stands for the session key: 16 bytes of its SHA-256, in hex.
func digest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

func TestRedis_NoSessionIDAppearsInAKeyName(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{})
	ids := []string{"session:7", "session:alice", "user:bob@example.com", "session:" + strings.Repeat("z", 40)}
	for _, id := range ids {
		mustSet(t, r, redisModel, id, tenantA)
		mustGet(t, r, redisModel, id, tenantA)
	}
	keys, err := srv.Client().Keys(context.Background(), "*").Result()
	if err != nil || len(keys) != len(ids) {
		t.Fatalf("keys %v, %v; want %d", keys, err, len(ids))
	}
	want := map[string]bool{}
	for _, id := range ids {
		want["cacheroute:sess2:"+redisModel+":"+digest(id)] = true
	}
	for _, k := range keys {
		if !want[k] || strings.Contains(k, "session:") || strings.Contains(k, "user:") || strings.Contains(k, "alice") || strings.Contains(k, "bob") {
			t.Fatalf("key %q is not the digest of a session key, or shows one", k)
		}
	}
}

// Set gives the entry the session TTL, and a hit gives it the full TTL again.
func TestRedis_TTLSetOnWriteAndRefreshedOnHit(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{TTL: time.Hour})
	c := srv.Client()
	ctx := context.Background()
	key := r.Key(redisModel, "session:ttl")

	mustSet(t, r, redisModel, "session:ttl", tenantA)
	if ttl := c.TTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("TTL after Set = %v, want about 1h", ttl)
	}
	if err := c.Expire(ctx, key, 10*time.Second).Err(); err != nil { // as if 59m50s had passed
		t.Fatal(err)
	}
	mustGet(t, r, redisModel, "session:ttl", tenantA)
	if ttl := c.TTL(ctx, key).Val(); ttl <= 59*time.Minute {
		t.Fatalf("TTL after a hit = %v, want it refreshed to about 1h", ttl)
	}
	// A miss creates nothing.
	mustGet(t, r, redisModel, "session:none", "")
	if n := c.Exists(ctx, r.Key(redisModel, "session:none")).Val(); n != 0 {
		t.Fatal("a miss created a key")
	}
}

// Redis itself expires an entry that nobody reads for the TTL.
func TestRedis_EntryExpiresAfterTTL(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{TTL: 300 * time.Millisecond})
	c := srv.Client()
	ctx := context.Background()
	key := r.Key(redisModel, "session:short")

	mustSet(t, r, redisModel, "session:short", tenantA)
	if pttl := c.PTTL(ctx, key).Val(); pttl <= 0 || pttl > 300*time.Millisecond {
		t.Fatalf("PTTL = %v, want in (0, 300ms]", pttl)
	}
	for i := 0; c.Exists(ctx, key).Val() == 1; i++ {
		if i == 200 {
			t.Fatal("the key did not expire within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustGet(t, r, redisModel, "session:short", "")
}

// RemoveTenantsWithBase leaves Redis untouched (entries are ignored by the policy and
// overwritten); it must not fail.
func TestRedis_RemoveTenantsWithBaseLeavesEntries(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{})
	mustSet(t, r, redisModel, "session:a", tenantA)
	if err := r.RemoveTenantsWithBase(context.Background(), "http://10.0.0.1:8000"); err != nil {
		t.Fatal(err)
	}
	mustGet(t, r, redisModel, "session:a", tenantA)
}

// A stalled server makes calls fail with a timeout instead of blocking; the call returns while
// the server is still stopped, so it was not waiting for the server.
func TestRedis_StalledServerTimesOut(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{Timeout: 100 * time.Millisecond})
	mustSet(t, r, redisModel, "session:a", tenantA)
	srv.Pause()
	defer srv.Resume()
	if _, _, err := r.Get(context.Background(), redisModel, "session:a"); err == nil {
		t.Fatal("Get on a stopped server succeeded")
	}
	if err := r.Set(context.Background(), redisModel, "session:b", tenantA); err == nil {
		t.Fatal("Set on a stopped server succeeded")
	}
	if !srv.Paused() {
		t.Fatal("the server is no longer stopped; the calls may have waited for it")
	}
	srv.Resume()
	waitOK(t, func() error { _, _, err := r.Get(context.Background(), redisModel, "session:a"); return err })
	mustGet(t, r, redisModel, "session:a", tenantA)
}

// The client reconnects by itself after the server died and came back on the same address.
func TestRedis_ReconnectsAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{Timeout: 200 * time.Millisecond})
	mustSet(t, r, redisModel, "session:a", tenantA)
	srv.Stop()
	if _, _, err := r.Get(context.Background(), redisModel, "session:a"); err == nil {
		t.Fatal("Get with the server down succeeded")
	}
	if err := r.Ping(context.Background()); err == nil {
		t.Fatal("Ping with the server down succeeded")
	}
	srv.Restart()
	waitOK(t, func() error { return r.Ping(context.Background()) })
	mustGet(t, r, redisModel, "session:a", "") // the new server is empty
	mustSet(t, r, redisModel, "session:a", tenantB)
	mustGet(t, r, redisModel, "session:a", tenantB)
}

// waitOK retries f for up to about 15 s (the client's background re-dial runs once a second).
func waitOK(t *testing.T, f func() error) {
	t.Helper()
	var err error
	for range 300 {
		if err = f(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("still failing after 15s: %v", err)
}

func TestParseRedisURL(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		check     func(t *testing.T, o *redis.UniversalOptions)
	}{
		{"host and port", "redis://10.0.0.5:6380", func(t *testing.T, o *redis.UniversalOptions) {
			if len(o.Addrs) != 1 || o.Addrs[0] != "10.0.0.5:6380" || o.DB != 0 || o.TLSConfig != nil || o.Username != "" || o.Password != "" {
				t.Errorf("%+v", o)
			}
		}},
		{"default port", "redis://redis.default.svc", func(t *testing.T, o *redis.UniversalOptions) {
			if o.Addrs[0] != "redis.default.svc:6379" {
				t.Errorf("addrs %v", o.Addrs)
			}
		}},
		{"user, password and db", "redis://router:s%40cret@h:6379/3", func(t *testing.T, o *redis.UniversalOptions) {
			if o.Username != "router" || o.Password != "s@cret" || o.DB != 3 {
				t.Errorf("user %q password %q db %d", o.Username, o.Password, o.DB)
			}
		}},
		{"password only", "redis://:pw@h", func(t *testing.T, o *redis.UniversalOptions) {
			if o.Username != "" || o.Password != "pw" {
				t.Errorf("user %q password %q", o.Username, o.Password)
			}
		}},
		{"rediss is TLS with the host as server name", "rediss://u:p@cache.example.com:6380/2", func(t *testing.T, o *redis.UniversalOptions) {
			if o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example.com" || o.TLSConfig.InsecureSkipVerify {
				t.Fatalf("tls %+v", o.TLSConfig)
			}
			if o.DB != 2 || o.Addrs[0] != "cache.example.com:6380" || o.Username != "u" || o.Password != "p" {
				t.Errorf("%+v", o)
			}
		}},
		{"ipv6", "redis://[::1]:7000/1", func(t *testing.T, o *redis.UniversalOptions) {
			if o.Addrs[0] != "[::1]:7000" || o.DB != 1 {
				t.Errorf("addrs %v db %d", o.Addrs, o.DB)
			}
		}},
		{"cluster seeds", "redis://a:7000?addr=b:7001&addr=c", func(t *testing.T, o *redis.UniversalOptions) {
			if strings.Join(o.Addrs, ",") != "a:7000,b:7001,c:6379" {
				t.Errorf("addrs %v", o.Addrs)
			}
		}},
		{"cluster configuration endpoint", "rediss://cfg.cache.example.com?cluster=true", func(t *testing.T, o *redis.UniversalOptions) {
			if !o.IsClusterMode || len(o.Addrs) != 1 {
				t.Errorf("%+v", o)
			}
		}},
		{"sentinel", "redis://:datapw@s1:26379/4?addr=s2:26379&master_name=mymaster&sentinel_password=sentpw", func(t *testing.T, o *redis.UniversalOptions) {
			if o.MasterName != "mymaster" || o.SentinelPassword != "sentpw" || o.Password != "datapw" || o.DB != 4 || len(o.Addrs) != 2 {
				t.Errorf("%+v", o)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := session.ParseRedisURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

func TestParseRedisURL_Rejects(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"http://h:6379", "scheme"},
		{"h:6379", "scheme"},
		{"redis://", "host"},
		{"redis:///0", "host"},
		{"redis://h/x", "database"},
		{"redis://h/1/2", "database"},
		{"redis://h/-1", "database"},
		{"redis://h:99999", "port"},
		{"redis://h?dial_timeout=1s", "unknown parameter"},
		{"redis://h?cluster=maybe", "boolean"},
		{"redis://a/2?addr=b", "database 0"},
		{"redis://user:topsecret@h:6379/x", "database"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := session.ParseRedisURL(tc.url)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "topsecret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

func TestNewRedis_BadURL(t *testing.T) {
	if _, err := session.NewRedis(session.RedisOptions{URL: "redis://h?bogus=1"}); err == nil {
		t.Fatal("NewRedis accepted a bad URL")
	}
}

// NewRedis does not contact the server, so a router starts while Redis is down.
func TestNewRedis_DoesNotConnect(t *testing.T) {
	r, err := session.NewRedis(session.RedisOptions{URL: "redis://127.0.0.1:1", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, _, err := r.Get(context.Background(), redisModel, "session:a"); err == nil {
		t.Fatal("Get against a closed port succeeded")
	}
}

// serverFiles writes a server certificate for 127.0.0.1 and its key to dir.
func serverFiles(t *testing.T, ca *testkit.CA, dir string) (certFile, keyFile string) {
	t.Helper()
	leaf := ca.Issue(t, 2, false)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for path, data := range map[string][]byte{certFile: leaf.CertPEM, keyFile: leaf.KeyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// startTLSRedis runs a redis-server that speaks TLS only, on a free loopback port, with a
// certificate for 127.0.0.1 signed by ca, and returns its rediss:// URL once it answers.
func startTLSRedis(t *testing.T, ca *testkit.CA) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found in PATH, and CI is set: %v", err)
		}
		t.Skip("redis-server not installed; skipped outside CI")
	}
	dir := t.TempDir()
	certFile, keyFile := serverFiles(t, ca, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var out bytes.Buffer
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	url := "rediss://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), ServerName: "127.0.0.1"}})
	defer c.Close()
	for range 200 { // up to about 10 s
		select {
		case <-exited:
			if strings.Contains(out.String(), "TLS") && strings.Contains(out.String(), "not") {
				t.Skipf("redis-server without TLS support: %s", out.String())
			}
			t.Fatalf("redis-server exited: %s", out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return url
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("redis-server with TLS did not answer PING within 10s")
	return ""
}

func TestRedis_RedissTrustsTheGivenCA(t *testing.T) {
	ca := testkit.NewCA(t, "session test CA")
	url := startTLSRedis(t, ca)
	r, err := session.NewRedis(session.RedisOptions{URL: url, Timeout: 2 * time.Second, RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mustSet(t, r, redisModel, "session:a", tenantA)
	mustGet(t, r, redisModel, "session:a", tenantA)
}

// Without the CA (the system roots) or with another CA, the server's certificate is not trusted
// and no call succeeds: the TLS connection is verified, not merely encrypted.
func TestRedis_RedissRefusesAServerItsCAsDoNotVouchFor(t *testing.T) {
	url := startTLSRedis(t, testkit.NewCA(t, "session test CA"))
	for name, roots := range map[string]*x509.CertPool{"system roots": nil, "another CA": testkit.NewCA(t, "session test CA").Pool()} {
		t.Run(name, func(t *testing.T) {
			r, err := session.NewRedis(session.RedisOptions{URL: url, Timeout: 2 * time.Second, RootCAs: roots})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			err = r.Ping(context.Background())
			if err == nil {
				t.Fatal("Ping succeeded against a server whose certificate no trusted CA signed")
			}
			if !strings.Contains(err.Error(), "certificate") {
				t.Errorf("Ping error %q is not about the certificate", err)
			}
		})
	}
}

func TestNewRedis_CAsWithAPlainURLAreAnError(t *testing.T) {
	_, err := session.NewRedis(session.RedisOptions{URL: "redis://127.0.0.1:6379", RootCAs: testkit.NewCA(t, "session test CA").Pool()})
	if err == nil || !strings.Contains(err.Error(), "rediss://") {
		t.Fatalf("NewRedis = %v, want an error asking for rediss://", err)
	}
}
