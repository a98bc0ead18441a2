package main

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemoEndToEnd builds the real binaries and runs a tiny demo: two mockworker
// processes, an extproc process and the data plane, two sessions of three turns.
func TestDemoEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../extproc", "../mockworker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as `make build`, sharing `make vet`'s compile
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))
	o := options{bin: bin, workers: 2, sessions: 2, turns: 3, prefixWords: 300, userWords: 20, outputTokens: 8, speed: 20, seed: 1}
	res, err := runPolicy(o, "kvroute", "")
	require.NoError(t, err)
	assert.Equal(t, 4, res.resumed)
	assert.Len(t, res.ttft, 6)
	assert.Zero(t, res.moved, "two idle workers: sessions stay with their holders")
	assert.Greater(t, res.hitRatio, 0.5, "resumed turns hit the worker's cache")
	assert.Equal(t, 2, res.eventWorkers, "kvroute's index follows both workers from their KV events")
	assert.Positive(t, res.storedEvents)
}
