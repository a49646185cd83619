//go:build !race

package prefixtree

const raceEnabled = false
