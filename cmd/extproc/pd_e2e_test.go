package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
)

// The mock workers' counters of disaggregated requests.
const (
	remotePrefills    = "mockworker_remote_prefill_requests_total"
	transferredTokens = "mockworker_transferred_prompt_tokens_total"
	disaggregations   = "kvroute_filter_disaggregation_total"
)

// pdFleet is kvroute, with explain enabled, behind the test data plane in front of a
// disaggregated fleet of simulated vLLM workers: decode workers d0 and d1, each playing
// llm-d's routing sidecar, and plain prefill workers p0 and p1.
type pdFleet struct {
	*running
	client  openai.Client
	address map[string]string // worker name → ip:port
}

var (
	decodeWorkers  = []string{"d0", "d1"}
	prefillWorkers = []string{"p0", "p1"}
)

// startPDFleet starts the fleet; edit, when set, changes kvroute's config first.
func startPDFleet(t *testing.T, edit func(*config.Config)) *pdFleet {
	t.Helper()
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	cfg.Tokenizers = approxTokenizersConfig() // the mock workers' own pair
	cfg.Explain.Enabled = true
	f := &pdFleet{address: map[string]string{}}
	for i, name := range append(append([]string{}, decodeWorkers...), prefillWorkers...) {
		role := router.RoleDecode
		if strings.HasPrefix(name, "p") {
			role = router.RolePrefill
		}
		s, err := mockworker.New(mockworker.Config{Name: name, Speed: 50, Seed: uint64(i + 1), PrefillSidecar: role == router.RoleDecode,
			Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096}})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		f.address[name] = srv.Listener.Addr().String()
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: name, Address: f.address[name],
			Models: []string{"qwen"}, CapacityBlocks: 512, Role: role})
	}
	if edit != nil {
		edit(&cfg)
	}
	f.running = serveApp(t, cfg)
	f.client = openai.NewClient(option.WithBaseURL(f.envoy.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	return f
}

// workerCounter reads a counter from a mock worker's /metrics page.
func (f *pdFleet) workerCounter(t *testing.T, worker, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + f.address[worker] + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	require.Contains(t, families, name, "%s exports it", worker)
	return families[name].GetMetric()[0].GetCounter().GetValue()
}

// prefillsServed is how many prefill legs the prefill workers served in all.
func (f *pdFleet) prefillsServed(t *testing.T) float64 {
	t.Helper()
	total := 0.0
	for _, p := range prefillWorkers {
		total += f.workerCounter(t, p, remotePrefills)
	}
	return total
}

// disaggregation reads kvroute_filter_disaggregation_total{outcome, prefill_worker}
// from kvroute's admin /metrics (0 when the series is absent).
func (f *pdFleet) disaggregation(t *testing.T, outcome, prefillWorker string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(f.metrics(t)))
	require.NoError(t, err)
	for _, m := range families[disaggregations].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["outcome"] == outcome && labels["prefill_worker"] == prefillWorker {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// putPolicy changes kvroute's policy on its admin port.
func (f *pdFleet) putPolicy(t *testing.T, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, f.adminURL+"/policy", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// traceOf is the decision kvroute answered in the response's explain header.
func traceOf(t *testing.T, resp *http.Response) explain.Trace {
	t.Helper()
	var tr explain.Trace
	require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr), "the decision header")
	return tr
}

// TestPDConversationIsPrefilledRemotelyThenResumesOnItsDecodeWorker: through Envoy
// (envoytest) and kvroute, a cold conversation goes to a decode worker with a prefill
// worker named in x-prefiller-host-port; the decode worker's sidecar has it prefill the
// prompt and decodes with the transferred KV. kvroute's metric and decision header name
// the prefill worker that did. The conversation's next turn, with disaggregate_tokens
// raised at runtime above what its decode worker now misses, returns to that decode
// worker and is prefilled there, with no prefill leg.
func TestPDConversationIsPrefilledRemotelyThenResumesOnItsDecodeWorker(t *testing.T) {
	f := startPDFleet(t, nil)
	ctx := context.Background()
	conversation := messages("billing")
	var resp *http.Response
	chat, err := f.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: conversation, MaxTokens: openai.Int(4)},
		option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, chat.Choices, 1)
	answer := chat.Choices[0].Message.Content
	assert.NotEmpty(t, answer, "a real completion")
	decode, prefill := resp.Header.Get("x-served-by"), resp.Header.Get("x-prefilled-by")
	require.Contains(t, decodeWorkers, decode, "a decode worker serves it")
	require.Contains(t, prefillWorkers, prefill, "a prefill worker prefilled it")
	assert.Equal(t, 1.0, f.workerCounter(t, prefill, remotePrefills))
	assert.Equal(t, 1.0, f.prefillsServed(t), "one prefill leg in all")
	transferred := f.workerCounter(t, decode, transferredTokens)
	assert.Positive(t, transferred, "the decode worker read the prompt's KV")
	assert.Equal(t, 1.0, f.disaggregation(t, "prefill", prefill))
	first := traceOf(t, resp)
	assert.Equal(t, decode, first.Worker)
	require.NotNil(t, first.Prefill, "the trace has the prefill worker")
	assert.Equal(t, prefill, first.Prefill.Worker, "the decision header names the worker that prefilled")
	assert.Equal(t, f.address[prefill], first.Prefill.Address)
	assert.Equal(t, first.PromptTokens, first.MissingTokens, "a cold decode worker misses the whole prompt")

	// The first turn's length: more than the next turn adds, less than the whole next
	// prompt, which a cold worker would still have prefilled remotely.
	threshold := first.PromptTokens
	f.putPolicy(t, fmt.Sprintf(`{"disaggregate_tokens": %d}`, threshold))
	conversation = append(conversation, openai.AssistantMessage(answer), openai.UserMessage("And what does it leave to others?"))
	_, err = f.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: conversation, MaxTokens: openai.Int(4)},
		option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
	require.NoError(t, err)
	assert.Equal(t, decode, resp.Header.Get("x-served-by"), "the next turn returns to its decode worker")
	assert.Empty(t, resp.Header.Get("x-prefilled-by"), "and is prefilled there")
	assert.Equal(t, 1.0, f.prefillsServed(t), "no new prefill leg")
	assert.Equal(t, transferred, f.workerCounter(t, decode, transferredTokens), "no KV transferred")
	assert.Equal(t, 1.0, f.disaggregation(t, "under_threshold", ""))
	assert.Equal(t, 1.0, f.disaggregation(t, "prefill", prefill), "unchanged")
	second := traceOf(t, resp)
	assert.Nil(t, second.Prefill)
	assert.Equal(t, router.DecodeOnlyUnderThreshold, second.DecodeOnly)
	assert.Positive(t, second.MissingTokens)
	assert.Less(t, second.MissingTokens, threshold, "it misses only the new turn")
	assert.Greater(t, second.PromptTokens, threshold)
}

// TestPDStreamedRequestIsPrefilledRemotely: a streamed chat request is split as a
// non-streamed one is (the prefill leg itself is not streamed), and its SSE chunks reach
// the client through Envoy and kvroute.
func TestPDStreamedRequestIsPrefilledRemotely(t *testing.T) {
	f := startPDFleet(t, nil)
	var resp *http.Response
	stream := f.client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
		Messages: messages("search"), MaxTokens: openai.Int(4), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}},
		option.WithResponseInto(&resp))
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		chunks++
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	require.NoError(t, stream.Err())
	assert.Greater(t, chunks, 1, "streamed")
	assert.NotEmpty(t, text.String())
	assert.Contains(t, decodeWorkers, resp.Header.Get("x-served-by"))
	prefill := resp.Header.Get("x-prefilled-by")
	require.Contains(t, prefillWorkers, prefill)
	assert.Equal(t, 1.0, f.workerCounter(t, prefill, remotePrefills))
	assert.Positive(t, f.workerCounter(t, resp.Header.Get("x-served-by"), transferredTokens))
	assert.Equal(t, 1.0, f.disaggregation(t, "prefill", prefill))
}

// TestPDClientSentPrefillerHeaderNeverReachesTheSidecar: a client's own
// x-prefiller-host-port, naming a server outside the fleet, never reaches the decode
// worker's sidecar, which would send it the prompt: kvroute removes it from a request
// it does not split and overwrites it with its prefill worker on one it splits.
func TestPDClientSentPrefillerHeaderNeverReachesTheSidecar(t *testing.T) {
	tests := []struct {
		name               string
		disaggregateTokens float64
		wantPrefilled      bool
	}{
		{"not split: removed", 1e6, false},
		{"split: overwritten", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hits atomic.Int64
			outsider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				hits.Add(1)
				_, _ = w.Write([]byte(`{}`)) // a prefill the sidecar would accept
			}))
			t.Cleanup(outsider.Close)
			f := startPDFleet(t, func(c *config.Config) { c.Policy.DisaggregateTokens = tt.disaggregateTokens })
			var resp *http.Response
			_, err := f.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen", Messages: messages("legal"),
				MaxTokens: openai.Int(4)}, option.WithResponseInto(&resp),
				option.WithHeader(mockworker.DefaultPrefillerHeader, outsider.Listener.Addr().String()))
			require.NoError(t, err)
			assert.Zero(t, hits.Load(), "the client's prefill worker got nothing")
			assert.Contains(t, decodeWorkers, resp.Header.Get("x-served-by"))
			prefilledBy := resp.Header.Get("x-prefilled-by")
			if !tt.wantPrefilled {
				assert.Empty(t, prefilledBy)
				assert.Zero(t, f.prefillsServed(t))
				assert.Equal(t, 1.0, f.disaggregation(t, "under_threshold", ""))
				return
			}
			assert.Contains(t, prefillWorkers, prefilledBy, "kvroute's prefill worker, not the client's")
			assert.Equal(t, 1.0, f.prefillsServed(t))
		})
	}
}
