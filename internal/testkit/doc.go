// Package testkit holds the small helpers the project's tests share, so that each is written once:
// a bounded wait for a condition, a log sink safe for concurrent writers, a certificate authority
// for TLS tests, a counting test server and a one-call HTTP exchange.
//
// Only _test.go files import it (TestOnlyTestsImportTestkit checks this): it calls testing.TB's
// Fatal, which has no place in the router.
package testkit
