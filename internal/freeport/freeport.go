// Package freeport finds a free TCP port on 127.0.0.1 for a process started by the caller to
// listen on (haproxy, redis-server). The port is free when Port returns, not reserved: another
// process may take it before the caller's binds, so callers retry on a bind failure.
package freeport

import "net"

// Port returns a TCP port on 127.0.0.1 that no listener held a moment ago.
func Port() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
