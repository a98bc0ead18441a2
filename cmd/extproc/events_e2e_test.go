package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/models"
)

// eventWorker is a simulated engine serving OpenAI requests and publishing its KV
// events over loopback ZMQ, as vLLM does with --kv-events-config.
type eventWorker struct {
	name   string
	server *mockworker.Server
	http   *httptest.Server
	client openai.Client // straight to the worker, bypassing kvroute
}

// The workers tokenize with tokenizers (nil: the approximate pair), which must be what
// kvroute is configured with.
func startEventWorkers(t *testing.T, n int, tokenizers mockworker.Tokenizers) []*eventWorker {
	t.Helper()
	return startEventWorkersWith(t, n, tokenizers, nil)
}

// startEventWorkersWith starts n event workers serving the LoRA adapters given (name →
// base model) besides their model.
func startEventWorkersWith(t *testing.T, n int, tokenizers mockworker.Tokenizers, adapters map[string]string) []*eventWorker {
	t.Helper()
	return startEventWorkersOn(t, n, tokenizers, eventEngine{adapters: adapters})
}

// eventEngine is what differs between the event workers' engines: their LoRA
// adapters (name → base model), their device cache (0: 512 blocks) and their host
// tier (0: none).
type eventEngine struct {
	adapters                                  map[string]string
	deviceBlocks, hostBlocks, hostChunkBlocks int
}

func startEventWorkersOn(t *testing.T, n int, tokenizers mockworker.Tokenizers, e eventEngine) []*eventWorker {
	t.Helper()
	var out []*eventWorker
	for i := range n {
		s, err := mockworker.New(mockworker.Config{Name: fmt.Sprint("w", i),
			Engine: sim.Config{NumGPUBlocks: cmp.Or(e.deviceBlocks, 512), BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096, HostBlocks: e.hostBlocks, HostChunkBlocks: e.hostChunkBlocks},
			Speed:  50, Seed: uint64(i + 1),
			Events:     &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Form: kvevents.Form(i % 2)},
			Tokenizers: tokenizers, LoRAAdapters: e.adapters})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		out = append(out, &eventWorker{name: fmt.Sprint("w", i), server: s, http: srv,
			client: openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))})
	}
	return out
}

// eventsConfig is kvroute's config for the workers: every one in event mode.
func eventsConfig(workers []*eventWorker) config.Config {
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	for _, w := range workers {
		p := w.server.Events()
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: w.name, Address: strings.TrimPrefix(w.http.URL, "http://"),
			Models: []string{"qwen"}, CapacityBlocks: 512,
			KVEvents: &router.KVEvents{Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()}})
	}
	return cfg
}

// dataPlane is the test data plane (BUFFERED requests, STREAMED responses) in front of
// the kvroute serving ext_proc at grpcAddr; it stops with the test.
func dataPlane(t *testing.T, grpcAddr string) *envoytest.Server {
	t.Helper()
	envoy := envoytest.NewServer(envoytest.Config{ProcessorAddress: grpcAddr, SendProtocolConfig: true, MessageTimeout: 10 * time.Second,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}})
	t.Cleanup(func() { assert.NoError(t, envoy.Close()) })
	return envoy
}

// clientThroughEnvoy is an OpenAI client of the test data plane (BUFFERED requests,
// STREAMED responses) in front of the kvroute serving ext_proc at grpcAddr; the data
// plane stops with the test.
func clientThroughEnvoy(t *testing.T, grpcAddr string) openai.Client {
	t.Helper()
	envoy := dataPlane(t, grpcAddr)
	return openai.NewClient(option.WithBaseURL(envoy.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
}

// serveBuilt builds kvroute from cfg with the real wiring and serves it on loopback.
func serveBuilt(t *testing.T, cfg config.Config) (*app, string) {
	t.Helper()
	require.NoError(t, cfg.Validate())
	a, err := build(cfg, nil, discardLogger())
	require.NoError(t, err)
	grpcAddr, _ := serveOnLoopback(t, a)
	return a, grpcAddr
}

// serveOnLoopback serves a on new loopback listeners until the test ends, then checks
// it stopped cleanly; it returns the ext_proc and admin addresses.
func serveOnLoopback(t *testing.T, a *app) (grpcAddr, adminAddr string) {
	t.Helper()
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.process.Serve(ctx, grpcLn, adminLn) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return grpcLn.Addr().String(), adminLn.Addr().String()
}

// conversation is a long system prompt plus a question: 14 blocks of 16 Qwen3 tokens
// (23 of the approximate tokenizer's).
func conversation(topic string) (system, question string) {
	return strings.Repeat("You are the assistant of the "+topic+" team and answer briefly. ", 18), "What does the " + topic + " team do?"
}

func messages(topic string) []openai.ChatCompletionMessageParamUnion {
	system, question := conversation(topic)
	return []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(question)}
}

// promptBlocks is the conversation's block hashes as kvroute computes them with
// tokenizers.
func promptBlocks(t *testing.T, tokenizers router.Tokenizers, topic string) []uint64 {
	t.Helper()
	system, question := conversation(topic)
	p, err := router.Prompter{BlockSize: 16, Tokenizers: tokenizers}.Prompt(context.Background(),
		&router.Request{Model: "qwen", Chat: tokenize.TextChat("system", system, "user", question)})
	require.NoError(t, err)
	require.Empty(t, p.Fallback)
	return p.Blocks
}

// approxTokenizers is the approximate pair for every model, as a kvroute config with
// tokenizers: {default: {approx: true}} has it.
func approxTokenizers() router.Tokenizers {
	return router.OneTokenizer(tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}})
}

// waitIndexed waits until a's index holds the prompt's first blocks from w's events.
func waitIndexed(t *testing.T, a *app, worker string, blocks []uint64, want int) {
	t.Helper()
	ov := make([]int, 1)
	require.Eventually(t, func() bool {
		a.index.ConfirmedOverlaps(blocks, []string{worker}, ov)
		return ov[0] >= want
	}, 20*time.Second, 5*time.Millisecond, "kvroute never learned %s's blocks from its events (has %d)", worker, ov[0])
}

// TestRoutesARepeatedPrefixFromEventStateAlone: each conversation is first sent to a
// worker directly, past kvroute, so kvroute's only knowledge of where its blocks are
// is that worker's KV events. Sent again through Envoy (envoytest) and kvroute, each
// conversation goes to the worker that holds it, and the engine confirms the hit. The
// workers tokenize with the embedded Qwen3 tokenizer and template (loaded apart from
// kvroute's), and kvroute runs with no tokenizers configured: its embedded default must
// give the engine's very ids for the events to match.
func TestRoutesARepeatedPrefixFromEventStateAlone(t *testing.T) {
	engineTokenizers, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	workers := startEventWorkers(t, 3, engineTokenizers)
	a, grpcAddr := serveBuilt(t, eventsConfig(workers))
	client := clientThroughEnvoy(t, grpcAddr)
	ctx := context.Background()

	topics := []string{"billing", "search", "storage"}
	for i, w := range workers {
		require.Eventually(t, w.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
		_, err := w.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: messages(topics[i]), MaxTokens: openai.Int(2)})
		require.NoError(t, err)
		blocks := promptBlocks(t, a.tokenizers, topics[i])
		require.Greater(t, len(blocks), 12)
		waitIndexed(t, a, w.name, blocks, len(blocks)-1)
	}
	for i, w := range workers {
		var resp *http.Response
		chat, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: messages(topics[i]),
			MaxTokens: openai.Int(2)}, option.WithResponseInto(&resp))
		require.NoError(t, err)
		assert.Equal(t, w.name, resp.Header.Get("x-served-by"), "conversation %d goes to the worker whose events reported it", i)
		assert.Greater(t, chat.Usage.PromptTokensDetails.CachedTokens, chat.Usage.PromptTokens/2, "and the engine serves it from cache")
	}

	for _, w := range workers {
		assert.Equal(t, 1.0, metricValue(t, a, "kvroute_kvevents_worker_mode", map[string]string{"worker": w.name, "mode": "events"}))
	}
}

// metricValue reads one gauge or counter series from a's registry (-1 when absent).
func metricValue(t *testing.T, a *app, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := a.registry.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestTwoReplicasOnTheSameEventsAgree: two kvroute instances subscribed to the same
// workers, with the same policy seed and no requests in flight, compute the same
// overlaps and make the same decision for the same request, whatever traffic reached
// the workers past them: what several replicas need to route alike without talking to
// each other.
func TestTwoReplicasOnTheSameEventsAgree(t *testing.T) {
	workers := startEventWorkers(t, 3, nil)
	cfg := eventsConfig(workers)
	cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
	replicas := make([]*app, 2)
	for i := range replicas {
		replicas[i], _ = serveBuilt(t, cfg)
	}
	ctx := context.Background()
	topics := []string{"billing", "search", "storage", "legal", "hiring", "travel"}
	for i, topic := range topics {
		w := workers[i%len(workers)]
		require.Eventually(t, w.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
		_, err := w.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: messages(topic), MaxTokens: openai.Int(20)})
		require.NoError(t, err)
	}
	for i, topic := range topics {
		blocks := promptBlocks(t, approxTokenizers(), topic)
		for _, a := range replicas {
			waitIndexed(t, a, workers[i%len(workers)].name, blocks, len(blocks)-1)
		}
	}
	names := []string{"w0", "w1", "w2"}
	require.Eventually(t, func() bool {
		for _, n := range names {
			if replicas[0].index.ConfirmedEntries(n) != replicas[1].index.ConfirmedEntries(n) {
				return false
			}
		}
		return true
	}, 20*time.Second, 5*time.Millisecond, "the replicas never converged on the same blocks")

	for _, topic := range append(topics, "weather", "finance") { // two prompts no worker holds
		blocks := promptBlocks(t, approxTokenizers(), topic)
		var overlaps [2][]int
		var chosen [2]string
		for r, a := range replicas {
			overlaps[r] = make([]int, len(names))
			a.index.Overlaps(blocks, names, overlaps[r])
			system, question := conversation(topic)
			d, err := a.router.Route(ctx, &router.Request{Model: "qwen", Chat: tokenize.TextChat("system", system, "user", question)})
			require.NoError(t, err)
			chosen[r] = d.Worker
			d.Release()
		}
		assert.Equal(t, overlaps[0], overlaps[1], "overlaps of %s", topic)
		assert.Equal(t, chosen[0], chosen[1], "decision for %s", topic)
	}
}
