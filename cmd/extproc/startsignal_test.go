package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeworker"
)

// extprocArgsEnv, set, makes the test binary run extproc with these arguments (one per
// line) instead of the tests: a process of its own, whose signals the test may send.
const extprocArgsEnv = "KVROUTE_TEST_EXTPROC_ARGS"

// TestSIGHUPWhileStartingIsNotFatal sends SIGHUP to a server still reading its config:
// a config reloader (a sidecar watching the ConfigMap) signals whenever the file
// changes, a pod starting included. Go's default for SIGHUP ends the process; the
// server must take it as a reload instead, applied once it serves.
func TestSIGHUPWhileStartingIsNotFatal(t *testing.T) {
	if args := os.Getenv(extprocArgsEnv); args != "" {
		os.Exit(run(context.Background(), strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	worker := fakeworker.New("w0")
	t.Cleanup(worker.Close)
	adminAddr := freeAddress(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "kvroute.yaml")
	config := func(weight int) string {
		return fmt.Sprintf("grpc_address: 127.0.0.1:0\nadmin_address: %s\npolicy: {prefix_affinity_weight: %d}\n"+
			"tokenizers: {default: {approx: true}}\nworkers:\n  - {name: w0, address: %q}\n", adminAddr, weight, worker.Address)
	}
	// The config is a named pipe: the server's read of it waits for the test to write.
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	logs := &lockedBuffer{}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGHUPWhileStartingIsNotFatal$")
	cmd.Env = append(os.Environ(), extprocArgsEnv+"=-config\n"+path)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	// Opening the pipe returns once the server has opened it: it is reading its config.
	pipe, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	time.Sleep(100 * time.Millisecond) // delivered: a process it ends is gone by now
	_, _ = pipe.WriteString(config(1))
	// The change the signal announced: the file the reload reads next.
	next := filepath.Join(dir, "next.yaml")
	require.NoError(t, os.WriteFile(next, []byte(config(7)), 0o600))
	require.NoError(t, os.Rename(next, path))
	_ = pipe.Close()

	policy := func() string {
		resp, err := http.Get("http://" + adminAddr + "/policy")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, resp.Status)
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		return b.String() + string(buf[:n])
	}
	for deadline := time.Now().Add(time.Minute); !strings.Contains(policy(), `"prefix_affinity_weight":7`); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the server ended on SIGHUP while starting: %v; its logs: %s", err, logs)
		default:
		}
		require.True(t, time.Now().Before(deadline), "the reload the signal asked for was never applied; the logs: %s", logs)
	}
	// The reload logs after it applies the policy: the line may follow the answer.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"config reloaded"`) },
		time.Minute, 10*time.Millisecond, "the reload is logged; the logs: %s", logs)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		assert.NoError(t, err, "SIGTERM drains and exits 0; the logs: %s", logs)
	case <-time.After(time.Minute):
		t.Fatalf("the server did not stop on SIGTERM; the logs: %s", logs)
	}
}
