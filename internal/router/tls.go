package router

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

// TLS in the router:
//
//   - The traffic and metrics listeners serve TLS 1.2 or later with --tls-cert-file and
//     --tls-key-file. The certificate is taken from a certReloader, which re-reads the files when
//     they change, so a rotated certificate is served without a restart.
//   - https:// workers are reached with one client configuration (newWorkerTLS, given to the
//     one upstream.Dialer): the CAs of --worker-ca-file instead of the system roots, and the
//     client certificate of --worker-client-cert-file / --worker-client-key-file (itself
//     reloaded like the server's) for workers that ask for one.
//   - A rediss:// session store trusts the CAs of --redis-ca-file.

// certCheckInterval is how often, at most, a handshake looks at the certificate files' size and
// modification time. A rotated certificate is served from the first handshake after the next look.
const certCheckInterval = 5 * time.Second

// certReloader holds a certificate and its key loaded from two PEM files, and loads them again
// when either file changes. The files are looked at (stat, no read) at most once per interval,
// by whichever handshake comes first once the interval has passed; the other handshakes meanwhile
// take the certificate in use without waiting. Reload loads them now, changed or not (SIGHUP).
//
// A pair that does not load (a missing file, a key that does not match the certificate, a file
// caught half written) leaves the certificate in use in place and is logged once; it is tried
// again when the files change again. Replace each file by renaming a new one over it (as a
// Kubernetes Secret volume does); whichever goes first, the pair is refused until the other
// follows, and the certificate in use is served meanwhile.
type certReloader struct {
	certFile, keyFile string
	what              string // for the log: "TLS certificate", "worker client certificate"
	log               *slog.Logger
	interval          time.Duration

	cert      atomic.Pointer[tls.Certificate]
	nextCheck atomic.Int64 // Unix nanoseconds of the next look at the files

	mu      sync.Mutex   // one look or load at a time; guards the fields below
	seen    [2]fileStamp // the files as last loaded, or as last refused
	failure string       // the error last logged; empty after a load succeeds
}

// fileStamp tells one version of a file from the next without reading it: a file renamed over
// it has another inode; one rewritten in place, another modification time or size.
type fileStamp struct {
	modNs int64
	size  int64
	ino   uint64
}

// newCertReloader loads the pair once; an error here stops the router from starting.
func newCertReloader(certFile, keyFile, what string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, what: what, log: log, interval: certCheckInterval}
	stamps, err := r.stamps()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	r.cert.Store(&cert)
	r.seen = stamps
	r.nextCheck.Store(time.Now().Add(r.interval).UnixNano())
	return r, nil
}

// current returns the certificate to present, first loading the files again if a look is due
// and they changed.
func (r *certReloader) current() *tls.Certificate {
	if now := time.Now().UnixNano(); now >= r.nextCheck.Load() && r.mu.TryLock() {
		r.nextCheck.Store(now + int64(r.interval))
		_ = r.loadLocked(false)
		r.mu.Unlock()
	}
	return r.cert.Load()
}

// Reload loads the files now, whether or not they changed. On error the certificate in use stays.
func (r *certReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextCheck.Store(time.Now().Add(r.interval).UnixNano())
	return r.loadLocked(true)
}

// loadLocked loads the pair if force or if the files changed since last seen. r.mu is held.
func (r *certReloader) loadLocked(force bool) error {
	stamps, err := r.stamps()
	if err == nil && !force && stamps == r.seen {
		return nil
	}
	if err == nil {
		var cert tls.Certificate
		if cert, err = tls.LoadX509KeyPair(r.certFile, r.keyFile); err == nil {
			r.cert.Store(&cert)
			r.seen, r.failure = stamps, ""
			attrs := []any{"cert_file", r.certFile}
			if cert.Leaf != nil {
				attrs = append(attrs, "serial", cert.Leaf.SerialNumber.Text(16), "not_after", cert.Leaf.NotAfter)
			}
			r.log.Info(r.what+" loaded", attrs...)
			return nil
		}
	}
	// Not tried again until the files change (a failed stat leaves zero stamps, so the file's
	// return is a change), and logged once per distinct error unless asked for.
	r.seen = stamps
	if msg := err.Error(); force || msg != r.failure {
		r.failure = msg
		r.log.Warn(r.what+" not loaded; the one in use is kept", "cert_file", r.certFile, "error", err)
	}
	return err
}

func (r *certReloader) stamps() ([2]fileStamp, error) {
	var out [2]fileStamp
	for i, path := range []string{r.certFile, r.keyFile} {
		fi, err := os.Stat(path)
		if err != nil {
			return [2]fileStamp{}, err
		}
		out[i] = fileStamp{modNs: fi.ModTime().UnixNano(), size: fi.Size()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			out[i].ino = uint64(st.Ino)
		}
	}
	return out, nil
}

// serverConfig is the listeners' TLS configuration: TLS 1.2 or later, HTTP/1.1, the reloaded
// certificate.
func (r *certReloader) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.current(), nil
		},
	}
}

// tlsListener serves TLS over ln, giving each connection until timeout after its accept to
// finish the handshake, reading and writing alike; past it the connection is closed. The
// handshake runs on the connection's own goroutine (fasthttp starts it before reading the first
// request), never in the accept loop, so a client that connects and stays silent, or sends its
// hello a byte at a time, holds one connection for the header timeout at most.
func tlsListener(ln net.Listener, cfg *tls.Config, timeout time.Duration) net.Listener {
	return &handshakeBoundListener{Listener: ln, cfg: cfg, timeout: timeout}
}

type handshakeBoundListener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration
}

func (l *handshakeBoundListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &boundTLSConn{Conn: tls.Server(c, l.cfg), deadline: time.Now().Add(l.timeout)}, nil
}

// boundTLSConn is a server TLS connection whose handshake must end by deadline, whoever starts
// it: an explicit Handshake, or the first Read or Write. It keeps the methods of *tls.Conn
// (fasthttp recognises TLS by Handshake and ConnectionState), and exposes the TCP socket's
// SyscallConn so the proxy can still see a client that closed its connection.
type boundTLSConn struct {
	*tls.Conn
	deadline time.Time
	done     atomic.Bool
}

func (c *boundTLSConn) Handshake() error {
	if c.done.Load() {
		return nil
	}
	ctx, cancel := context.WithDeadline(context.Background(), c.deadline)
	defer cancel()
	if err := c.Conn.HandshakeContext(ctx); err != nil {
		return err
	}
	c.done.Store(true)
	return nil
}

func (c *boundTLSConn) Read(p []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *boundTLSConn) Write(p []byte) (int, error) {
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// SyscallConn is the TCP socket's, for peeking at whether the client closed it.
func (c *boundTLSConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.NetConn().(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// newWorkerTLS is the client configuration for https:// workers (upstream.NewTLS), with the
// certificate reloader of the client certificate (nil without one).
func newWorkerTLS(cfg config.Config, log *slog.Logger) (*tls.Config, *certReloader, error) {
	var roots *x509.CertPool
	if cfg.WorkerCAFile != "" {
		var err error
		if roots, err = loadCAs(cfg.WorkerCAFile); err != nil {
			return nil, nil, fmt.Errorf("--worker-ca-file: %w", err)
		}
	}
	if cfg.WorkerClientCertFile == "" {
		return upstream.NewTLS(roots, nil), nil, nil
	}
	rl, err := newCertReloader(cfg.WorkerClientCertFile, cfg.WorkerClientKeyFile, "worker client certificate", log)
	if err != nil {
		return nil, nil, fmt.Errorf("--worker-client-cert-file, --worker-client-key-file: %w", err)
	}
	return upstream.NewTLS(roots, rl.current), rl, nil
}

// loadCAs reads a PEM bundle of CA certificates; a file with none in it is an error.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("no PEM certificate found in %s", path)
	}
	return pool, nil
}

// ReloadCertificates loads the listeners' certificate and the worker client certificate from
// their files now (SIGHUP), whether or not the files changed. A pair that does not load leaves
// the one in use in place; the errors are returned together.
func (r *Router) ReloadCertificates() error {
	var errs []error
	if r.certs != nil {
		if err := r.certs.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("--tls-cert-file: %w", err))
		}
	}
	if r.workerCert != nil {
		if err := r.workerCert.Reload(); err != nil {
			errs = append(errs, fmt.Errorf("--worker-client-cert-file: %w", err))
		}
	}
	return errors.Join(errs...)
}
