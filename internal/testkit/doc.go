// Package testkit holds the small helpers the project's tests share, so that each is written once:
// bounded waits for a condition (WaitFor, WaitWithin, Poll), a manual clock (Clock), a log sink
// safe for concurrent writers (SyncBuffer), a certificate authority for TLS tests (CA), loopback
// listeners and the goroutine that serves on one (Listen, FreePort, Go), test servers that count
// their requests or speak HTTP/1.1 by hand (Server, NamedServer, RawServer), and a one-call HTTP
// exchange (Send, Header).
//
// Only _test.go files import it (TestOnlyTestsImportTestkit checks this): it calls testing.TB's
// Fatal, which has no place in the router. It imports none of the project's packages, so that any
// package's tests can use it.
package testkit
