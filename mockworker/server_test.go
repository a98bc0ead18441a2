package mockworker

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/sim"
)

func start(t *testing.T) (*Server, openai.Client, string) {
	t.Helper()
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0)), srv.URL
}

func TestConversationTurnsHitTheCache(t *testing.T) {
	_, client, _ := start(t)
	ctx := context.Background()
	history := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(strings.Repeat("Answer briefly and precisely please. ", 20)),
		openai.UserMessage("First question?"),
	}
	first, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "mock", Messages: history, MaxTokens: openai.Int(20)})
	require.NoError(t, err)
	assert.Equal(t, int64(0), first.Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, int64(20), first.Usage.CompletionTokens)
	answer := first.Choices[0].Message.Content
	assert.Len(t, strings.Fields(answer), 20, "one word per token")

	history = append(history, openai.AssistantMessage(answer), openai.UserMessage("Second question?"))
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "mock", Messages: history,
		MaxTokens: openai.Int(5), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		c := stream.Current()
		if len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
		if c.Usage.PromptTokens > 0 {
			usage = c.Usage
		}
	}
	require.NoError(t, stream.Err())
	assert.Len(t, strings.Fields(text.String()), 5)
	// The first turn's prompt and all but the last generated token are cached, to whole
	// 16-token blocks.
	cached := usage.PromptTokensDetails.CachedTokens
	assert.Greater(t, cached, first.Usage.PromptTokens, "the previous answer is part of the cached prefix")
	assert.LessOrEqual(t, cached, first.Usage.PromptTokens+first.Usage.CompletionTokens)
	assert.Zero(t, cached%16)
}

func TestCompletionsAndMetrics(t *testing.T) {
	s, client, url := start(t)
	ctx := context.Background()
	c, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "mock",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("tokens ", 50))}, MaxTokens: openai.Int(3)})
	require.NoError(t, err)
	assert.Len(t, strings.Fields(c.Choices[0].Text), 3)

	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"} {
		assert.Contains(t, string(body), name)
	}
	blocks, err := enginemetrics.ParseCapacity(body, "vllm:cache_config_info", "num_gpu_blocks", enginemetrics.UnitBlocks, 16, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, 256, blocks, "num_gpu_blocks, read as kvroute reads vLLM's")
	resp, err = http.Get(url + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "mock", Messages: []openai.ChatCompletionMessageParamUnion{}})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 400, apiErr.StatusCode)
	assert.True(t, s.ranks[0].engine.Idle())
}

func TestClientCancelAbortsTheRequest(t *testing.T) {
	s, client, _ := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "mock",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("go on forever")}, MaxTokens: openai.Int(4000)}) // within the 4,096-token context
	require.True(t, stream.Next())
	cancel()
	for stream.Next() {
	}
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.ranks[0].engine.Idle()
	}, 10e9, 1e6, "the engine dropped the request")
}

func TestTokensPerEventGroupsTheStream(t *testing.T) {
	tests := []struct {
		name     string
		perEvent int
		want     []int // words per content event
	}{
		{"one event per token", 1, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{"first token alone, then four at a time", 4, []int{1, 4, 4, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048},
				Speed: 100, Seed: 1, TokensPerEvent: tt.perEvent})
			require.NoError(t, err)
			srv := httptest.NewServer(s.Handler())
			defer func() { srv.Close(); s.Close() }()
			client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
			stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "mock",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count")}, MaxTokens: openai.Int(10)})
			var got []int
			for stream.Next() {
				if c := stream.Current(); len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
					got = append(got, len(strings.Fields(c.Choices[0].Delta.Content)))
				}
			}
			require.NoError(t, stream.Err())
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestBatchSlotsAreHonouredAndTheQueueIsExported(t *testing.T) {
	// One batch slot: of three long requests one runs and two wait, and /metrics says
	// so in vLLM's names, as the gie picker's scraper reads them.
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 1, MaxBatchedTokens: 2048}, Speed: 1, Seed: 1})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		go func() {
			stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "mock",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("slot ", 10+i))}, MaxTokens: openai.Int(3000)})
			for stream.Next() {
			}
		}()
	}
	var waiting, usage float64
	var running string
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		w, u, err := enginemetrics.Parse(strings.NewReader(string(body)), "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
		if err != nil {
			return false
		}
		waiting, usage = float64(w), u
		running = ""
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "vllm:num_requests_running ") {
				running = strings.TrimPrefix(line, "vllm:num_requests_running ")
			}
		}
		return waiting == 2 && running == "1" && usage > 0
	}, 30*time.Second, 5*time.Millisecond, "one request runs in the one slot, holding KV blocks, and two wait")
	cancel()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.ranks[0].engine.Idle()
	}, 30*time.Second, time.Millisecond, "cancelled requests leave the engine")
}

// An adapter's prompt is cached apart from its base model's, as a LoRA engine caches
// it, and the worker lists the adapter with its parent as vLLM's /v1/models does.
func TestAnAdaptersCacheIsItsOwn(t *testing.T) {
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1,
		LoRAAdapters: map[string]string{"sql": "mock"}})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	prompt := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(strings.Repeat("Answer briefly and precisely please. ", 20)), openai.UserMessage("Hi?")}

	for i, step := range []struct {
		model      string
		wantCached bool
	}{{"mock", false}, {"sql", false}, {"sql", true}, {"mock", true}} {
		resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: step.model, Messages: prompt, MaxTokens: openai.Int(1)})
		require.NoError(t, err)
		assert.Equal(t, step.wantCached, resp.Usage.PromptTokensDetails.CachedTokens > 0, "request %d (%s)", i, step.model)
	}

	res, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	assert.JSONEq(t, `{"object":"list","data":[{"id":"mock","object":"model","parent":null,"max_model_len":4096},{"id":"sql","object":"model","parent":"mock"}]}`, string(body))
}

// With ServedModels, the worker answers a model it does not serve, or an adapter it has
// not loaded, with vLLM's 404, and lists only what it serves.
func TestAWorkerWithServedModelsRefusesOthers(t *testing.T) {
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1,
		LoRAAdapters: map[string]string{"sql": "qwen"}, ServedModels: []string{"qwen"}})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	for _, tt := range []struct {
		model      string
		wantStatus int
	}{{"qwen", 0}, {"sql", 0}, {"chat", http.StatusNotFound}, {"mock", http.StatusNotFound}} {
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: tt.model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi?")}, MaxTokens: openai.Int(1)})
		if tt.wantStatus == 0 {
			assert.NoError(t, err, tt.model)
			continue
		}
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr, tt.model)
		assert.Equal(t, tt.wantStatus, apiErr.StatusCode, tt.model)
		assert.Contains(t, apiErr.Message, "The model `"+tt.model+"` does not exist.")
	}
	res, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	assert.JSONEq(t, `{"object":"list","data":[{"id":"qwen","object":"model","parent":null,"max_model_len":4096},{"id":"sql","object":"model","parent":"qwen"}]}`, string(body))
}

// TestAPromptPastTheContextGetsVLLMs400: a prompt of max_model_len tokens or more is
// refused before it is scheduled, in vLLM's words, and the model list gives the length
// (kvroute routes on it); one token fewer is served.
func TestAPromptPastTheContextGetsVLLMs400(t *testing.T) {
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1,
		MaxModelLen: 100})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	for _, tt := range []struct {
		tokens     int
		maxTokens  string
		wantStatus int
		wantError  string
	}{
		{99, `1`, http.StatusOK, ""},
		{99, `null`, http.StatusOK, ""},
		{100, `1`, http.StatusBadRequest, "However, you requested 100 tokens in the messages"},
		{100, `null`, http.StatusBadRequest, "However, you requested 100 tokens in the messages"},
		{1000, `null`, http.StatusBadRequest, "However, you requested 1000 tokens in the messages"},
		{60, `40`, http.StatusOK, ""},
		{60, `41`, http.StatusBadRequest, "However, you requested 101 tokens (60 in the messages, 41 in the completion)"},
	} {
		ids := make([]string, tt.tokens)
		for i := range ids {
			ids[i] = strconv.Itoa(i + 1)
		}
		res, err := http.Post(srv.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":`+tt.maxTokens+`,"prompt":[`+strings.Join(ids, ",")+`]}`))
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, tt.wantStatus, res.StatusCode, "%d tokens, max_tokens %s: %s", tt.tokens, tt.maxTokens, body)
		if tt.wantStatus == http.StatusBadRequest {
			assert.Contains(t, string(body), "This model's maximum context length is 100 tokens. "+tt.wantError)
		}
	}
	_, err = New(Config{Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 1, MaxModelLen: -1})
	require.ErrorContains(t, err, "max_model_len: must be ≥ 0")
}
