package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize/models"
)

// postReload asks the admin port to reload with next as the file's content.
func (d *deployment) postReload(t *testing.T, next config.Config, loadErr error) (int, map[string]any) {
	t.Helper()
	d.nextMu.Lock()
	d.next, d.loadErr = next, loadErr
	d.nextMu.Unlock()
	resp, err := http.Post(d.adminURL+"/reload", "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

func (d *deployment) running(t *testing.T) config.Config {
	t.Helper()
	return d.app.reloader.Running()
}

func TestReloadChangesTheFleetAndThePolicy(t *testing.T) {
	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil,
		slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()
	ctx := context.Background()
	newcomer := fakeworker.New("w3")
	t.Cleanup(newcomer.Close)
	d.workers[newcomer.Name], d.byAddress[newcomer.Address] = newcomer, newcomer.Name

	// Remove w0, add w3, and change the policy.
	next := d.running(t)
	next.Router.Workers = append([]router.Worker{}, next.Router.Workers[1:]...)
	next.Router.Workers = append(next.Router.Workers, router.Worker{Name: "w3", Address: newcomer.Address, Models: []string{"qwen"}})
	next.Policy.PrefixAffinityWeight = 6
	status, summary := d.postReload(t, next, nil)
	require.Equal(t, http.StatusOK, status, summary)
	assert.Equal(t, []any{"w3"}, summary["added"])
	assert.Equal(t, []any{"w0"}, summary["removed"])
	assert.Equal(t, []any{}, summary["changed"], "an empty list, not null")
	assert.Equal(t, true, summary["policy"])
	assert.Equal(t, 6.0, d.app.policy.Params().PrefixAffinityWeight)

	_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("after the reload " + strings.Repeat("x ", 40))}})
	require.NoError(t, err)
	var candidates []string
	for _, c := range logs.lastDecision(t) {
		candidates = append(candidates, c["worker"].(string))
	}
	assert.ElementsMatch(t, []string{"w1", "w2", "w3"}, candidates, "the next decision is made among the new fleet")
	delete(d.workers, "w0")
	metrics := d.scrape(t)
	assert.NotContains(t, metrics, `worker="w0"`, "a removed worker's series are gone")
	assert.Contains(t, metrics, `kvroute_worker_eligible{worker="w3"} 1`)
	assert.Contains(t, metrics, `kvroute_scoring_active_requests{worker="w3"} 0`)
	assert.Contains(t, metrics, `kvroute_config_reloads_total{result="applied"} 1`)
	d.requireNoLoad(t)
}

func TestReloadRefusesWhatNeedsARestartAndBadFiles(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil)
	defer d.stop()
	before := d.running(t)
	tests := []struct {
		name    string
		edit    func(*config.Config)
		loadErr error
		want    string
	}{
		{"block size needs a restart", func(c *config.Config) { c.Router.BlockSize = 16 }, nil, "block_size changed: restart"},
		{"several keys are all named", func(c *config.Config) { c.Index.TTL = time.Hour; c.Policy.Picker = "random" }, nil, "policy.picker, index changed"},
		{"a bad worker list", func(c *config.Config) { c.Router.Workers = nil }, nil, "workers: at least one"},
		{"tokenizers need a restart", func(c *config.Config) {
			c.Tokenizers = models.Config{models.DefaultKey: {Approx: true}, "qwen": {Builtin: "qwen3"}}
		}, nil, "tokenizers (loaded once, at start) changed: restart"},
		{"an unreadable file", nil, os.ErrNotExist, "file does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := before
			next.Router.Workers = append([]router.Worker(nil), before.Router.Workers...)
			if tt.edit != nil {
				tt.edit(&next)
			}
			status, body := d.postReload(t, next, tt.loadErr)
			assert.Equal(t, http.StatusBadRequest, status)
			assert.Contains(t, body["error"], tt.want)
			assert.Equal(t, before, d.running(t), "nothing changed")
			assert.Len(t, d.app.router.Workers(), 3)
		})
	}
	assert.Contains(t, d.scrape(t), `kvroute_config_reloads_total{result="rejected"} 5`)
}

func TestReloadKeepsRuntimePolicyUpdatesUnlessTheFileChangesThePolicy(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil)
	defer d.stop()
	_, _, err := d.app.policy.Update([]byte(`{"temperature": 0.5}`))
	require.NoError(t, err)
	status, summary := d.postReload(t, d.running(t), nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, false, summary["policy"])
	assert.Equal(t, 0.5, d.app.policy.Params().Temperature, "a reload that leaves the policy alone keeps the runtime update")
}

func TestSIGHUPReloadsTheConfigFile(t *testing.T) {
	workers := []*fakeworker.Worker{fakeworker.New("w0"), fakeworker.New("w1")}
	for _, w := range workers {
		t.Cleanup(w.Close)
	}
	adminAddr := freeAddress(t)
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	write := func(names ...int) {
		var b strings.Builder
		fmt.Fprintf(&b, "grpc_address: 127.0.0.1:0\nadmin_address: %s\nworkers:\n", adminAddr)
		for _, i := range names {
			fmt.Fprintf(&b, "  - {name: w%d, address: %q}\n", i, workers[i].Address)
		}
		require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	}
	write(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	logs := &lockedBuffer{}
	go func() { done <- run(ctx, []string{"-config", path}, io.Discard, logs) }()
	defer func() {
		cancel()
		assert.Equal(t, 0, <-done)
	}()
	metrics := func() string {
		resp, err := http.Get("http://" + adminAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The server loads the embedded tokenizer first: seconds under the race detector on
	// a busy machine (a 10 s bound failed once in CI on 2 loaded cores).
	require.Eventually(t, func() bool { return strings.Contains(metrics(), `kvroute_worker_eligible{worker="w0"}`) }, time.Minute, 10*time.Millisecond,
		"the server never served its metrics; its logs: %s", logs)

	write(0, 1)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(metrics(), `kvroute_worker_eligible{worker="w1"} 1`) }, 30*time.Second, 10*time.Millisecond,
		"SIGHUP added w1; the logs: %s", logs)
	// The reload logs after it applies the workers: w1 may be seen first.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"config reloaded"`) }, 30*time.Second, 10*time.Millisecond,
		"the reload was logged; the logs: %s", logs)
}

// freeAddress returns a loopback address nothing listens on (for a server started by
// run, whose listener the test cannot hand over).
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestARequestInFlightOnARemovedWorkerKeepsGoingAndReleasesItsBooking(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, nil)
	defer d.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("HANG_AFTER_FIRST_TOKEN")}})
	require.True(t, stream.Next())
	holder := "" // the worker booked with the generation (Exchanges waits for it to end)
	for name := range d.workers {
		if d.app.bookings.Load(name).ActiveRequests == 1 {
			holder = name
		}
	}
	require.NotEmpty(t, holder)

	next := d.running(t)
	next.Router.Workers = nil
	for _, w := range d.running(t).Router.Workers {
		if w.Name != holder {
			next.Router.Workers = append(next.Router.Workers, w)
		}
	}
	status, summary := d.postReload(t, next, nil)
	require.Equal(t, http.StatusOK, status, summary)
	assert.Equal(t, []any{holder}, summary["removed"])

	assert.Equal(t, 1, d.app.bookings.Load(holder).ActiveRequests, "the generation on the removed worker is not cut")
	assert.NoError(t, stream.Err())
	cancel() // the client leaves
	require.Eventually(t, func() bool { return d.app.bookings.Load(holder) == (scoring.Load{}) }, 10*time.Second, 10*time.Millisecond,
		"its booking is released though the worker left the fleet")
}
