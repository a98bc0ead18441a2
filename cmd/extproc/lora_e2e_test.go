package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestAnAdapterRequestFollowsItsAdaptersEvents: the same conversation is sent past
// kvroute once under a LoRA adapter to one worker and once under the base model to
// another, so kvroute learns where each is only from the engines' KV events (the
// adapter's with lora_name and the name in every block's extra keys, as vLLM sends
// them). Through Envoy (envoytest) and kvroute, the adapter request goes to the worker
// holding the adapter's blocks and the base-model request to the one holding the base
// model's, and each engine confirms the hit: an adapter's cache is its own namespace,
// which kvroute's hashes of the request must reproduce.
func TestAnAdapterRequestFollowsItsAdaptersEvents(t *testing.T) {
	adapters := map[string]string{"sql": "qwen"}
	workers := startEventWorkersWith(t, 3, approxTokenizers(), adapters)
	cfg := eventsConfig(workers)
	cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
	cfg.Router.LoRAAdapters = []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	cfg.Explain.Enabled = true
	a, grpcAddr := serveBuilt(t, cfg)
	client := clientThroughEnvoy(t, grpcAddr)
	ctx := context.Background()

	system, question := conversation("billing")
	blocksOf := func(lora string) []uint64 {
		p, err := router.Prompter{BlockSize: 16, Tokenizers: approxTokenizers()}.Prompt(ctx,
			&router.Request{Model: "qwen", LoRA: lora, Chat: tokenize.TextChat("system", system, "user", question)})
		require.NoError(t, err)
		require.Greater(t, len(p.Blocks), 12)
		return p.Blocks
	}
	holders := []struct {
		model, lora string
		worker      *eventWorker
	}{{"sql", "sql", workers[1]}, {"qwen", "", workers[2]}}
	for _, h := range holders {
		require.Eventually(t, h.worker.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
		_, err := h.worker.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: h.model, Messages: messages("billing"), MaxTokens: openai.Int(2)})
		require.NoError(t, err)
		blocks := blocksOf(h.lora)
		waitIndexed(t, a, h.worker.name, blocks, len(blocks)-1)
		ov := make([]int, len(workers))
		a.index.ConfirmedOverlaps(blocks, []string{"w0", "w1", "w2"}, ov)
		for i, w := range workers {
			if w != h.worker {
				assert.Zero(t, ov[i], "%s holds none of %s's blocks", w.name, h.model)
			}
		}
	}

	for _, h := range holders {
		var resp *http.Response
		chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: h.model, Messages: messages("billing"), MaxTokens: openai.Int(2)},
			option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
		require.NoError(t, err)
		assert.Equal(t, h.worker.name, resp.Header.Get("x-served-by"), "%s goes to the worker whose events reported its blocks", h.model)
		assert.Greater(t, chat.Usage.PromptTokensDetails.CachedTokens, chat.Usage.PromptTokens/2, "and the engine serves %s from cache", h.model)
		var trace explain.Trace
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
		assert.Equal(t, "qwen", trace.Model, "the trace names the base model")
		assert.Equal(t, h.lora, trace.LoRA, "and the adapter")
	}
}

// TestAdapterSlotsScrapedFromTheEngines: two simulated vLLM workers run one LoRA
// adapter at a time (--max-loras 1) and say so on their metrics page
// (vllm:lora_requests_info{max_lora="1"}); kvroute is configured with no max_loras.
// Through Envoy (envoytest), once it has scraped the pages, a request for a second
// adapter is charged for the slot the first one holds (resident after its request) and
// goes to the other worker, and each adapter's next request joins its own worker.
func TestAdapterSlotsScrapedFromTheEngines(t *testing.T) {
	adapters := map[string]string{"sql": "qwen", "chat": "qwen"}
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	cfg.EngineMetrics.Interval = 20 * time.Millisecond
	cfg.Explain.Enabled = true
	cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
	cfg.Router.LoRAAdapters = []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}}
	for i := range 2 {
		s, err := mockworker.New(mockworker.Config{Name: fmt.Sprint("w", i), Speed: 50, Seed: uint64(i + 1), LoRAAdapters: adapters,
			Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096, MaxLoRAs: 1}})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: fmt.Sprint("w", i), Address: strings.TrimPrefix(srv.URL, "http://"),
			Models: []string{"qwen"}, CapacityBlocks: 512})
	}
	a, grpcAddr := serveBuilt(t, cfg)
	require.Eventually(t, func() bool { return a.scraper.MaxLoRAs("w0") == 1 && a.scraper.MaxLoRAs("w1") == 1 },
		10*time.Second, 10*time.Millisecond, "kvroute never read max_lora from the workers' pages")
	client := clientThroughEnvoy(t, grpcAddr)

	send := func(model, topic string) (worker string, trace explain.Trace) {
		t.Helper()
		var resp *http.Response
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: model, Messages: messages(topic), MaxTokens: openai.Int(2)},
			option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
		return resp.Header.Get("x-served-by"), trace
	}
	sqlWorker, _ := send("sql", "billing")
	chatWorker, trace := send("chat", "search")
	assert.NotEqual(t, sqlWorker, chatWorker, "the second adapter goes where no adapter holds the slot")
	for _, c := range trace.Candidates {
		assert.Equal(t, 1, c.MaxLoRAs, "%s's slots, as its page says", c.Worker)
		if c.Worker == sqlWorker {
			assert.Equal(t, 2.0, c.LoRABlocked, "sql holds %s's one slot", c.Worker)
		}
	}
	for _, topic := range []string{"storage", "legal"} {
		w, _ := send("sql", topic)
		assert.Equal(t, sqlWorker, w, "sql's %s conversation joins sql's worker", topic)
		w, _ = send("chat", topic)
		assert.Equal(t, chatWorker, w, "chat's %s conversation joins chat's worker", topic)
	}
	base, trace := send("qwen", "hiring")
	assert.NotEmpty(t, base)
	for _, c := range trace.Candidates {
		assert.Zero(t, c.LoRABlocked, "a base-model request takes no adapter slot")
	}
}

// TestAdaptersTheEnginesRunCountForTheCost: a request for adapter sql reaches w0
// directly, past kvroute (another router, a client with the pod's address, a request
// from before a restart), on workers that run one adapter at a time. kvroute has booked
// nothing, but w0's metrics page says sql runs there (running_lora_adapters): through
// Envoy (envoytest), a request for adapter chat is charged for the slot sql holds on w0
// and goes to w1, and the decision trace shows what the engine said.
func TestAdaptersTheEnginesRunCountForTheCost(t *testing.T) {
	_, grpcAddr := sqlRunningPastKvroute(t, 1, func(cfg *config.Config) { cfg.Explain.Enabled = true })
	ctx := context.Background()

	client := clientThroughEnvoy(t, grpcAddr)
	var resp *http.Response
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: messages("search"), MaxTokens: openai.Int(2)},
		option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
	require.NoError(t, err)
	assert.Equal(t, "w1", resp.Header.Get("x-served-by"), "chat goes where no adapter holds the slot")
	var trace explain.Trace
	require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
	seen := map[string]bool{}
	for _, c := range trace.Candidates {
		seen[c.Worker] = true
		switch c.Worker {
		case "w0":
			assert.Equal(t, []string{"sql"}, c.EngineAdapters, "what w0's page said")
			assert.Equal(t, 2.0, c.LoRABlocked, "sql's one request holds w0's only slot")
		case "w1":
			assert.Empty(t, c.EngineAdapters)
			assert.Equal(t, 1.0, c.LoRABlocked, "chat takes w1's free slot")
		}
	}
	assert.Equal(t, map[string]bool{"w0": true, "w1": true}, seen, "the trace scores both workers")
}

// TestGIELoRAPickerFollowsTheEnginesAdapters: with policy.picker gie-lora, kvroute
// scores as GIE's endpoint picker does with its lora-affinity scorer. A request for sql
// runs on w0 (sent there directly); w0's metrics page says so, and through Envoy
// (envoytest) the next sql request goes to w0, where its adapter runs (affinity 1),
// rather than to the idler w1 (a free slot, 0.8), which the gie picker alone prefers.
func TestGIELoRAPickerFollowsTheEnginesAdapters(t *testing.T) {
	a, grpcAddr := sqlRunningPastKvroute(t, 2, func(cfg *config.Config) { cfg.Policy.Picker = "gie-lora" })
	require.Eventually(t, func() bool { return a.scraper.LoRAState("w0", "sql") == scoring.LoRARunning },
		10*time.Second, 10*time.Millisecond, "kvroute never read w0's running adapter")
	assert.Equal(t, scoring.LoRASlotFree, a.scraper.LoRAState("w1", "sql"))
	ctx := context.Background()

	client := clientThroughEnvoy(t, grpcAddr)
	var resp *http.Response
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "sql", Messages: messages("search"), MaxTokens: openai.Int(2)},
		option.WithResponseInto(&resp))
	require.NoError(t, err)
	assert.Equal(t, "w0", resp.Header.Get("x-served-by"), "sql goes where its adapter runs")
}

// sqlRunningPastKvroute serves kvroute (its config changed by edit) in front of two
// simulated workers that run maxLoRAs LoRA adapters at once, and runs a long request
// for adapter sql straight on w0, past kvroute, until the test ends. It returns once
// kvroute has read w0's metrics page saying sql runs there.
func sqlRunningPastKvroute(t *testing.T, maxLoRAs int, edit func(*config.Config)) (*app, string) {
	t.Helper()
	adapters := map[string]string{"sql": "qwen", "chat": "qwen"}
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	cfg.EngineMetrics.Interval = 20 * time.Millisecond
	cfg.EngineModels.Interval = 0
	cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
	cfg.Router.LoRAAdapters = []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}}
	var direct []string
	for i := range 2 {
		// Speed 1: the direct request's 4,000 tokens take tens of seconds, so it is
		// still running when kvroute decides (it is cancelled at the end).
		s, err := mockworker.New(mockworker.Config{Name: fmt.Sprint("w", i), Speed: 1, Seed: uint64(i + 1), LoRAAdapters: adapters,
			Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096, MaxLoRAs: maxLoRAs}})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		direct = append(direct, srv.URL)
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: fmt.Sprint("w", i), Address: strings.TrimPrefix(srv.URL, "http://"),
			Models: []string{"qwen"}, CapacityBlocks: 512})
	}
	edit(&cfg)
	a, grpcAddr := serveBuilt(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	past := openai.NewClient(option.WithBaseURL(direct[0]+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	stream := past.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "sql", Messages: messages("billing"), MaxTokens: openai.Int(4000)})
	t.Cleanup(func() { stream.Close() })
	require.True(t, stream.Next(), "the direct request's first token: %v", stream.Err())
	require.Eventually(t, func() bool { return slices.Contains(a.scraper.EngineAdapters("w0"), "sql") },
		10*time.Second, 10*time.Millisecond, "kvroute never read w0's running adapter")
	return a, grpcAddr
}
