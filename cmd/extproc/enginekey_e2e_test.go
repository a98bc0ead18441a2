package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestEngineModeSendsTheAPIKey: a render server that wants an API key (a mock worker's
// render endpoints with one, as vLLM --api-key) renders the prompts of the model whose
// entry names the key file, and refuses the model whose entry names none: that model's
// requests are routed by load, counted, never failed. A reload reads the file again (a
// rotated Secret), and is refused, naming the key, when the file is empty. The key
// appears in no log line, decision trace or admin answer.
func TestEngineModeSendsTheAPIKey(t *testing.T) {
	const key, revoked = "sk-render-e2e", "sk-render-revoked"
	renderer, err := mockworker.New(mockworker.Config{Name: "render", Engine: sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 1024},
		Speed: 50, Seed: 1, RenderAPIKey: key})
	require.NoError(t, err)
	t.Cleanup(renderer.Close)
	srv := httptest.NewServer(renderer.Handler())
	t.Cleanup(srv.Close)
	keyFile := filepath.Join(t.TempDir(), "render-api-key")
	require.NoError(t, os.WriteFile(keyFile, []byte(key+"\n"), 0o600))

	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 16}
		c.Tokenizers["qwen"] = models.Entry{Engine: &engine.Config{URL: srv.URL, Timeout: 10 * time.Second, APIKeyFile: keyFile}}
		c.Tokenizers["nokey"] = models.Entry{Engine: &engine.Config{URL: srv.URL, Timeout: 10 * time.Second}}
		for i := range c.Router.Workers {
			c.Router.Workers[i].Models = []string{"qwen", "nokey"}
		}
	}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()

	var seen strings.Builder // every answer kvroute gave, searched for the key at the end
	// post sends a chat of model through the data plane, asking for the decision, and
	// returns how many prompt tokens the decision was made on (0: routed by load).
	post := func(model string) int {
		t.Helper()
		body := strings.Replace(chatBody, `"model":"qwen"`, `"model":"`+model+`"`, 1)
		req, err := http.NewRequest(http.MethodPost, d.envoy.URL+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-why", "1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "a render failure never fails the request")
		decision := resp.Header.Get(explain.ResponseHeader)
		seen.WriteString(decision)
		var tr explain.Trace
		require.NoError(t, json.Unmarshal([]byte(decision), &tr))
		return tr.PromptTokens
	}
	reload := func() (int, map[string]any) {
		t.Helper()
		status, body := d.postReload(t, d.running(t), nil)
		b, _ := json.Marshal(body)
		seen.Write(b)
		return status, body
	}

	assert.Positive(t, post("qwen"), "rendered with the key")
	assert.Zero(t, post("nokey"), "refused without a key: routed by load")
	metrics := d.scrape(t)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="ok"} 1`)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="nokey",outcome="unauthorized"} 1`)
	assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="engine"} 1`)

	// An emptied file: the reload is refused, naming the key, and the key in force stays.
	require.NoError(t, os.WriteFile(keyFile, nil, 0o600))
	status, body := reload()
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body["error"], "tokenizers.qwen.engine.api_key_file: "+keyFile+" is empty")
	assert.Positive(t, post("qwen"), "the running key stays")

	// A rotated file: the reload puts the new key in force for the next render.
	require.NoError(t, os.WriteFile(keyFile, []byte(revoked), 0o600))
	status, body = reload()
	require.Equal(t, http.StatusOK, status, body)
	assert.Zero(t, post("qwen"), "the server does not take the new key: routed by load")
	require.NoError(t, os.WriteFile(keyFile, []byte(key), 0o600))
	status, body = reload()
	require.Equal(t, http.StatusOK, status, body)
	assert.Positive(t, post("qwen"))

	metrics = d.scrape(t)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="ok"} 3`)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="unauthorized"} 1`)
	assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="engine"} 2`)
	assert.Contains(t, metrics, `kvroute_config_reloads_total{result="rejected"} 1`)
	status, decisions := get(t, d.adminURL+"/decisions?limit=16")
	require.Equal(t, http.StatusOK, status)
	seen.WriteString(decisions + metrics + logs.String())
	assert.Contains(t, logs.String(), "config reload rejected", "the logs were captured")
	assert.NotContains(t, seen.String(), "sk-render", "the key is in no log, decision, metric or admin answer")
	d.requireNoLoad(t)
}
