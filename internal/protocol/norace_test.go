//go:build !race

package protocol_test

// raceEnabled is set under the race detector, whose instrumentation makes large bodies slow.
const raceEnabled = false
