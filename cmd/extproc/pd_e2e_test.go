package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
)

// pdWorker is a simulated engine of a disaggregated fleet: a prefill worker, or a
// decode worker with llm-d's routing sidecar in front (mockworker's PrefillSidecar).
type pdWorker struct {
	name string
	http *httptest.Server
}

// counter reads one of the worker's own series (0 when absent).
func (w *pdWorker) counter(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(w.http.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + name + `(?:\{[^}]*\})? (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// TestADisaggregatedRequestIsPrefilledWhereKvrouteSays: two decode workers behind the
// sidecar and two prefill workers, through Envoy (envoytest) and kvroute. A new
// conversation is split: kvroute names a prefill worker in x-prefiller-host-port, the
// sidecar has it prefill, and the decode worker loads the KV and answers; the decision
// trace, the prefill worker's counter and kvroute's metric agree on the prefill worker.
// Its next turn, with disaggregate_tokens raised above the turn's new tokens, stays on
// its decode worker and is not split. A client's own prefiller header never reaches
// the sidecar.
func TestADisaggregatedRequestIsPrefilledWhereKvrouteSays(t *testing.T) {
	var workers []*pdWorker
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	cfg.Explain.Enabled = true
	for i, role := range []string{router.RoleDecode, router.RoleDecode, router.RolePrefill, router.RolePrefill} {
		name := fmt.Sprintf("%s-%d", role, i)
		s, err := mockworker.New(mockworker.Config{Name: name, Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096},
			Speed: 50, Seed: uint64(i + 1), PrefillSidecar: role == router.RoleDecode})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		workers = append(workers, &pdWorker{name: name, http: srv})
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: name, Address: strings.TrimPrefix(srv.URL, "http://"), Role: role})
	}
	byName := map[string]*pdWorker{}
	for _, w := range workers {
		byName[w.name] = w
	}
	require.NoError(t, cfg.Validate())
	a, err := build(cfg, nil, discardLogger())
	require.NoError(t, err)
	grpcAddr, adminAddr := serveOnLoopback(t, a)
	envoy := envoytest.NewServer(envoytest.Config{ProcessorAddress: grpcAddr, SendProtocolConfig: true, MessageTimeout: 10 * time.Second,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}})
	t.Cleanup(func() { assert.NoError(t, envoy.Close()) })
	client := openai.NewClient(option.WithBaseURL(envoy.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	ctx := context.Background()

	history := messages("disaggregation")
	var first *http.Response
	completion, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: history, MaxTokens: openai.Int(8)},
		option.WithHeader(explain.DefaultConfig().Header, "1"), option.WithResponseInto(&first))
	require.NoError(t, err)
	require.NotEmpty(t, completion.Choices[0].Message.Content)
	decode, prefill := first.Header.Get("x-served-by"), first.Header.Get("x-prefilled-by")
	assert.True(t, strings.HasPrefix(decode, "decode-"), "served by %q", decode)
	require.True(t, strings.HasPrefix(prefill, "prefill-"), "prefilled by %q", prefill)
	var trace explain.Trace
	require.NoError(t, json.Unmarshal([]byte(first.Header.Get(explain.ResponseHeader)), &trace))
	require.NotNil(t, trace.Prefill)
	assert.Equal(t, prefill, trace.Prefill.Worker, "the sidecar prefilled where kvroute said")
	assert.Equal(t, decode, trace.Worker)
	assert.Equal(t, 1.0, byName[prefill].counter(t, "mockworker_remote_prefill_requests_total"))
	assert.Positive(t, byName[decode].counter(t, "mockworker_transferred_prompt_tokens_total"), "the decode worker loaded the prompt")
	assert.Contains(t, scrape(t, adminAddr), fmt.Sprintf(`kvroute_filter_disaggregation_total{outcome="prefill",prefill_worker=%q} 1`, prefill))

	// The next turn lacks only its new tokens on its decode worker: with
	// disaggregate_tokens above them it is decoded there without a prefill hop.
	req, err := http.NewRequest(http.MethodPut, "http://"+adminAddr+"/policy", strings.NewReader(`{"disaggregate_tokens": 200}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	history = append(history, openai.AssistantMessage(completion.Choices[0].Message.Content), openai.UserMessage("and then?"))
	var second *http.Response
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: history, MaxTokens: openai.Int(8)},
		option.WithResponseInto(&second))
	require.NoError(t, err)
	assert.Equal(t, decode, second.Header.Get("x-served-by"), "the session stays on its decode worker")
	assert.Empty(t, second.Header.Get("x-prefilled-by"))
	assert.Equal(t, 1.0, byName[prefill].counter(t, "mockworker_remote_prefill_requests_total"))
	assert.Contains(t, scrape(t, adminAddr), `kvroute_filter_disaggregation_total{outcome="under_threshold",prefill_worker=""} 1`)

	// A client naming its own prefiller on a request kvroute does not split: the header
	// is removed before the sidecar sees it.
	var hits atomic.Int32
	trap := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); w.WriteHeader(http.StatusTeapot) }))
	t.Cleanup(trap.Close)
	var third *http.Response
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: history, MaxTokens: openai.Int(4)},
		option.WithHeader("x-prefiller-host-port", strings.TrimPrefix(trap.URL, "http://")), option.WithResponseInto(&third))
	require.NoError(t, err)
	assert.Zero(t, hits.Load(), "the client's prefiller was never called")
	assert.Empty(t, third.Header.Get("x-prefilled-by"))

	// Streaming, split again (threshold back to 0): the sidecar prefills, then streams.
	req, err = http.NewRequest(http.MethodPut, "http://"+adminAddr+"/policy", strings.NewReader(`{"disaggregate_tokens": 0}`))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: messages("a new topic"), MaxTokens: openai.Int(6)})
	var text strings.Builder
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			text.WriteString(c.Delta.Content)
		}
	}
	require.NoError(t, stream.Err())
	assert.NotEmpty(t, text.String())
	prefills := 0.0
	for _, w := range workers[2:] {
		prefills += w.counter(t, "mockworker_remote_prefill_requests_total")
	}
	assert.Equal(t, 2.0, prefills, "the streamed request was prefilled remotely too")
}

// scrape returns kvroute's /metrics page.
func scrape(t *testing.T, adminAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
