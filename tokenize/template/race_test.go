//go:build race

package template_test

// raceEnabled: the race detector makes the largest renders of the tests several times
// slower; they are left to runs without it.
const raceEnabled = true
