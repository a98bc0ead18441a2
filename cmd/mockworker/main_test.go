package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// start runs the command on a loopback port with args, fast and with the approximate
// tokenizers (which keep the test off loading the embedded one), and returns its
// address. At the test's end it stops the command, which must exit with 0.
func start(t *testing.T, args ...string) string {
	t.Helper()
	kvroute := filepath.Join(t.TempDir(), "kvroute.yaml")
	require.NoError(t, os.WriteFile(kvroute, []byte("workers: [{name: w, address: \"127.0.0.1:1\"}]\ntokenizers: {default: {approx: true}}\n"), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	out, stdout := io.Pipe()
	var stderr strings.Builder
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, append([]string{"-listen", "127.0.0.1:0", "-speed", "100", "-kvroute-config", kvroute}, args...), stdout, &stderr)
		stdout.Close()
	}()
	lines := bufio.NewReader(out)
	line, err := lines.ReadString('\n')
	require.NoError(t, err, stderr.String())
	go func() { _, _ = io.Copy(io.Discard, lines) }()
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	require.True(t, ok, line)
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, 0, <-exited, stderr.String())
	})
	return addr
}

// TestAPIKeyGuardsTheRenderEndpointsOnly runs the command with -api-key: its render
// endpoints answer 401 without the key or with another one, as vLLM --api-key does, and
// the ids with it; the completion endpoints stay open.
func TestAPIKeyGuardsTheRenderEndpointsOnly(t *testing.T) {
	addr := start(t, "-api-key", "s3cret")

	const chat = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":1}`
	tests := []struct {
		name, path, body, auth string
		status                 int
		want                   string
	}{
		{"chat render without the key", "/v1/chat/completions/render", chat, "", http.StatusUnauthorized, `{"error":"Unauthorized"}`},
		{"chat render with another key", "/v1/chat/completions/render", chat, "Bearer s3cre", http.StatusUnauthorized, `{"error":"Unauthorized"}`},
		{"chat render with the key bare", "/v1/chat/completions/render", chat, "s3cret", http.StatusUnauthorized, `{"error":"Unauthorized"}`},
		{"completions render without the key", "/v1/completions/render", `{"model":"m","prompt":"hello"}`, "", http.StatusUnauthorized, `{"error":"Unauthorized"}`},
		{"chat render with the key", "/v1/chat/completions/render", chat, "Bearer s3cret", http.StatusOK, `"token_ids":[`},
		{"completions render with the key", "/v1/completions/render", `{"model":"m","prompt":"hello"}`, "Bearer s3cret", http.StatusOK, `"token_ids":[`},
		{"chat completions stay open", "/v1/chat/completions", chat, "", http.StatusOK, `"choices"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			req.Header.Set("content-type", "application/json")
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tt.status, resp.StatusCode, string(body))
			assert.Contains(t, string(body), tt.want)
		})
	}
}

// TestPDSidecarFlag runs a prefill worker and a decode worker, the latter with and
// without -pd-sidecar: only with it does a request naming the prefill worker in
// x-prefiller-host-port get prefilled there.
func TestPDSidecarFlag(t *testing.T) {
	prefill := start(t, "-name", "p0")
	tests := []struct {
		name          string
		args          []string
		wantPrefilled string
	}{
		{"a sidecar", []string{"-name", "d0", "-pd-sidecar"}, "p0"},
		{"a plain worker ignores the header", []string{"-name", "d1"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			decode := start(t, tt.args...)
			req, err := http.NewRequest(http.MethodPost, "http://"+decode+"/v1/completions",
				strings.NewReader(`{"model":"m","prompt":"a prompt long enough to fill a few blocks of the cache","max_tokens":2}`))
			require.NoError(t, err)
			req.Header.Set("x-prefiller-host-port", prefill)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			assert.Equal(t, tt.args[1], resp.Header.Get("x-served-by"))
			assert.Equal(t, tt.wantPrefilled, resp.Header.Get("x-prefilled-by"))
		})
	}
}

func TestLoRAAdaptersFlag(t *testing.T) {
	tests := []struct {
		name, value string
		want        map[string]string
		wantErr     string
	}{
		{"none", "", nil, ""},
		{"two adapters", "sql=Qwen/Qwen3-8B, chat=Qwen/Qwen3-8B", map[string]string{"sql": "Qwen/Qwen3-8B", "chat": "Qwen/Qwen3-8B"}, ""},
		{"no base", "sql", nil, `"sql": want name=base_model`},
		{"empty base", "sql=", nil, `"sql=": want name=base_model`},
		{"empty entry", "sql=qwen,,", nil, `"": want name=base_model`},
		{"twice", "sql=qwen,sql=llama", nil, `adapter "sql" given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAdapters(tt.value)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestHostBlocksFlag runs the command with a host tier, which serves, and refuses a
// negative one naming the engine's field.
func TestHostBlocksFlag(t *testing.T) {
	addr := start(t, "-host-blocks", "64")
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"a prompt long enough to fill a few blocks of the cache","max_tokens":2}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))

	kvroute := filepath.Join(t.TempDir(), "kvroute.yaml")
	require.NoError(t, os.WriteFile(kvroute, []byte("workers: [{name: w, address: \"127.0.0.1:1\"}]\ntokenizers: {default: {approx: true}}\n"), 0o644))
	var stderr strings.Builder
	assert.Equal(t, 1, run(context.Background(), []string{"-listen", "127.0.0.1:0", "-kvroute-config", kvroute, "-host-blocks", "-1"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "host_blocks: must be ≥ 0")
}

// TestDataParallelSizeFlag runs the command with -data-parallel-size: a request's
// X-data-parallel-rank header picks its rank, one out of range gets vLLM's 400, and a
// size outside 1-64 is a usage error.
func TestDataParallelSizeFlag(t *testing.T) {
	addr := start(t, "-data-parallel-size", "3")
	const body = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":1}`
	for _, tt := range []struct {
		rank   string
		status int
	}{{"2", http.StatusOK}, {"1", http.StatusOK}, {"3", http.StatusBadRequest}} {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("x-data-parallel-rank", tt.rank)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, tt.status, resp.StatusCode, string(b))
		if tt.status == http.StatusOK {
			assert.Equal(t, tt.rank, resp.Header.Get("x-data-parallel-rank"))
		} else {
			assert.Contains(t, string(b), "data_parallel_rank 3 is out of range [0, 3).")
		}
	}
	for _, size := range []string{"0", "65"} {
		var stderr strings.Builder
		assert.Equal(t, 2, run(context.Background(), []string{"-listen", "127.0.0.1:0", "-data-parallel-size", size}, io.Discard, &stderr), size)
		assert.Contains(t, stderr.String(), "-data-parallel-size: must be 1-64")
	}
}
