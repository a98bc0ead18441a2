package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
)

// TestExplainAndDecisionsThroughTheServer: with explain enabled, a client asking with
// the explain header gets the decision in a response header (in both body modes of the
// shipped Envoy configs), and the admin port serves the sampled decisions.
func TestExplainAndDecisionsThroughTheServer(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, func(c *config.Config) {
				c.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 2}
			})
			defer d.stop()
			ctx := context.Background()
			var asked, plain *http.Response
			_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("why this worker?")}},
				option.WithHeader("x-why", "1"), option.WithResponseInto(&asked))
			require.NoError(t, err)
			var tr explain.Trace
			require.NoError(t, json.Unmarshal([]byte(asked.Header.Get(explain.ResponseHeader)), &tr))
			assert.Len(t, tr.Candidates, 3, "one entry per worker")
			assert.Equal(t, tr.Address, d.envoy.Exchanges()[0].Upstream, "the answer names where the request went")
			for _, w := range d.workers {
				for _, s := range w.Served() {
					assert.Empty(t, s.Header.Get("x-why"), "the explain header is not forwarded")
				}
			}

			for range 2 {
				_, err = d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("no questions asked")}},
					option.WithResponseInto(&plain))
				require.NoError(t, err)
				assert.Empty(t, plain.Header.Get(explain.ResponseHeader), "not asked, not answered")
			}

			status, body := get(t, d.adminURL+"/decisions?limit=5")
			require.Equal(t, http.StatusOK, status, body)
			var decisions explain.Decisions
			require.NoError(t, json.Unmarshal([]byte(body), &decisions))
			assert.Len(t, decisions.Decisions, 2, "the ring holds explain.buffer decisions")
			assert.NotContains(t, body, "no questions asked", "no request content")
			status, body = get(t, d.adminURL+"/decisions?limit=-1")
			assert.Equal(t, http.StatusBadRequest, status, body)
		})
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, strings.TrimSpace(string(raw))
}

// TestSessionAffinityThroughTheServer: the session header, with a weight set at
// runtime, keeps a session whose prompt was rewritten on its worker although that
// worker is busy; without the session the same kind of prompt avoids it.
func TestSessionAffinityThroughTheServer(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, nil)
	defer d.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The session's first request is still generating: its worker carries its load.
	busy := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("HANG_AFTER_FIRST_TOKEN " + strings.Repeat("a long history ", 40))}},
		option.WithHeader("x-session-id", "s1"))
	require.True(t, busy.Next())
	sessionWorker := ""
	for name, w := range d.workers {
		if len(w.Served()) > 0 {
			sessionWorker = name
		}
	}
	require.NotEmpty(t, sessionWorker)

	ask := func(text string, headers ...option.RequestOption) string {
		t.Helper()
		resp, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat(text, 20))}}, headers...)
		require.NoError(t, err)
		return strings.TrimPrefix(resp.Choices[0].Message.Content, "hello from ")
	}
	assert.NotEqual(t, sessionWorker, ask("a prompt without a session "), "the busy worker is avoided")

	req, err := http.NewRequest(http.MethodPut, d.adminURL+"/policy", strings.NewReader(`{"session_affinity_weight": 16}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, sessionWorker, ask("a compacted summary ", option.WithHeader("x-session-id", "s1")), "the session stays on its worker")
	assert.Contains(t, d.scrape(t), "kvroute_session_entries 1")
	cancel()
}
