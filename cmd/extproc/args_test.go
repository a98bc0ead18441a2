package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestArgumentsAfterTheFlagsAreRefused: flags end at the first argument that is not
// one, so "extproc -config F validate" used to serve F (and "extproc valdate -config F"
// asked for -config). Both are refused, naming the argument, before anything starts.
func TestArgumentsAfterTheFlagsAreRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	require.NoError(t, os.WriteFile(path, []byte("grpc_address: 127.0.0.1:0\nadmin_address: 127.0.0.1:0\n"+minimal), 0o600))
	for _, args := range [][]string{
		{"-config", path, "validate"},
		{"valdate", "-config", path},
		{"-config", path, "-log-level", "debug", "extra"},
	} {
		// Without the check the first and third would serve until the context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var out, errOut bytes.Buffer
		assert.Equal(t, 2, run(ctx, args, &out, &errOut), "%q: %s", args, errOut.String())
		assert.Contains(t, errOut.String(), "unexpected arguments", "%q", args)
		assert.NotContains(t, errOut.String(), "kvroute serving", "%q", args)
		cancel()
	}
}
