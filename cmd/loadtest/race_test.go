//go:build race

package main

// raceEnabled builds the kvroute under test with the race detector too.
const raceEnabled = true
