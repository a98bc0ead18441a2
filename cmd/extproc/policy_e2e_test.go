package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/logbuf"
)

// lockedBuffer collects kvroute's log lines, written from its goroutines.
type lockedBuffer struct{ logbuf.Buffer }

// lastDecision returns the candidates (best first) of the last "routed" line of the
// decision trace.
func (l *lockedBuffer) lastDecision(t *testing.T) []map[string]any {
	t.Helper()
	var last []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var entry struct {
			Msg      string `json:"msg"`
			Decision struct {
				Candidates []map[string]any `json:"candidates"`
			} `json:"decision"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "routed" {
			last = entry.Decision.Candidates
		}
	}
	require.NotEmpty(t, last, "a decision was traced")
	return last
}

func TestRuntimePolicyUpdateChangesTheNextDecision(t *testing.T) {
	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil,
		slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()
	ctx := context.Background()
	ask := func(text string) {
		t.Helper()
		_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat(text, 40))}})
		require.NoError(t, err)
	}
	policyURL := d.adminURL + "/policy"
	put := func(body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, policyURL, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		require.NoError(t, json.Unmarshal(raw, &out))
		return resp.StatusCode, out
	}

	ask("a cold prompt ")
	for _, c := range logs.lastDecision(t) {
		assert.Positive(t, c["affinity"], "the shipped default charges missing blocks")
	}

	status, body := put(`{"prefix_affinity_weight": 0, "cache_pressure_weight": 0}`)
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, 0.0, body["prefix_affinity_weight"])
	assert.Equal(t, 1.0, body["overlap_credit"], "keys not named keep their values")

	ask("another cold prompt ")
	for _, c := range logs.lastDecision(t) {
		assert.Zero(t, c["affinity"], "the next decision prices with the new policy")
		assert.Zero(t, c["pressure"])
	}

	status, body = put(`{"prefix_affinity_weight": -3}`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body["error"], "policy.prefix_affinity_weight")

	resp, err := http.Get(policyURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	var current map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&current))
	assert.Equal(t, 0.0, current["prefix_affinity_weight"], "the rejected update changed nothing")
	assert.Regexp(t, `kvroute_policy_updates_total\{result="applied"\} 1`, d.scrape(t))
}

func TestPolicyAPIIsReadOnlyForPickersWithoutCosts(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) { c.Policy.Picker = "round_robin" })
	defer d.stop()
	req, err := http.NewRequest(http.MethodPut, d.adminURL+"/policy", strings.NewReader(`{"prefix_affinity_weight": 1}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
}

func TestBatchPressureKeysFromConfigPolicyAPIAndTrace(t *testing.T) {
	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		for i := range c.Router.Workers {
			c.Router.Workers[i].MaxNumSeqs = 4 + i
		}
	}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()
	_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("batch slots ", 40))}})
	require.NoError(t, err)
	seqs := map[any]bool{}
	for _, c := range logs.lastDecision(t) {
		seqs[c["max_num_seqs"]] = true
		for _, term := range []string{"queued", "queue", "pending_requests", "shared_missing", "interference"} {
			assert.Contains(t, c, term)
		}
	}
	assert.Equal(t, map[any]bool{4.0: true, 5.0: true, 6.0: true}, seqs, "each worker's max_num_seqs reaches the cost")

	req, err := http.NewRequest(http.MethodPut, d.adminURL+"/policy", strings.NewReader(`{"queue_weight": 8, "shared_prefix_affinity": 0.5, "interference_weight": 1, "prefill_history_weight": 0.1, "prefill_history_half_life": 60}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var applied map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&applied))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, applied)
	assert.Equal(t, 8.0, applied["queue_weight"])
	assert.Equal(t, 0.5, applied["shared_prefix_affinity"])
	assert.Equal(t, 1.0, applied["interference_weight"])
	assert.Equal(t, 0.1, applied["prefill_history_weight"])
	assert.Equal(t, 60.0, applied["prefill_history_half_life"])
	_, err = d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("recent prefill ", 40))}})
	require.NoError(t, err)
	charged := 0
	for _, c := range logs.lastDecision(t) {
		if h, _ := c["history"].(float64); h > 0 {
			charged++
			assert.Positive(t, c["recent_prefill"])
		}
	}
	assert.Equal(t, 1, charged, "the trace charges the worker that computed the first prompt, and only it")

	req, err = http.NewRequest(http.MethodPut, d.adminURL+"/policy", strings.NewReader(`{"shared_prefix_affinity": 1.5}`))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(body), "policy.shared_prefix_affinity")
	assert.Contains(t, d.scrape(t), "kvroute_scoring_pending_requests{worker=")
}
