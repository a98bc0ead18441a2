package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// No Docker engine runs here, so the Dockerfile is checked by what it relies on: the
// files it copies exist, the build command it runs works as written (static, CGO off),
// the config it ships validates, and the final stage runs as non-root.
func TestDockerfile(t *testing.T) {
	f, err := os.Open("../../Dockerfile")
	require.NoError(t, err)
	defer f.Close()
	var stages, copies []string
	user := ""
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "FROM":
			stages = append(stages, scanner.Text())
			user = ""
		case "COPY":
			if !strings.HasPrefix(fields[1], "--from") {
				copies = append(copies, fields[1:len(fields)-1]...)
			}
		case "USER":
			user = fields[1]
		}
	}
	require.Len(t, stages, 2, "multi-stage")
	assert.Contains(t, stages[1], "static", "a static base for a static binary")
	assert.True(t, strings.HasPrefix(user, "nonroot"), "final stage runs as non-root")
	for _, c := range copies {
		if c == "." {
			continue
		}
		_, err := os.Stat(filepath.Join("../..", c))
		assert.NoError(t, err, "COPY source %s", c)
	}

	out := filepath.Join(t.TempDir(), "extproc")
	// The Dockerfile's build, less -trimpath (it only rewrites file names, and would make
	// CI compile every dependency once more: this way the build reuses `make vet`'s).
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", out, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	msg, err := build.CombinedOutput()
	require.NoError(t, err, string(msg))
	msg, err = exec.Command(out, "validate", "-config", "../../examples/kvroute.yaml").CombinedOutput()
	require.NoError(t, err, string(msg))
	assert.Contains(t, string(msg), "ok")
}
