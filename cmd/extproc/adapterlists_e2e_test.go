package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	"github.com/kvroute/kvroute/sim"
)

// engineFleet serves kvroute (explain on, the engines' model lists read every 20 ms
// unless lists is false) in front of one simulated vLLM worker per engine (w0, w1,
// …), each configured with workerModels (none: every model), after edit.
func engineFleet(t *testing.T, engines []mockworker.Config, workerModels []string, lists bool, edit func(*config.Config)) (a *app, grpcAddr, adminAddr string) {
	t.Helper()
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Policy.Seed = 42
	cfg.Health.Interval = 0
	cfg.EngineModels.Interval = 0
	if lists {
		cfg.EngineModels.Interval = 20 * time.Millisecond
	}
	cfg.Explain.Enabled = true
	cfg.Tokenizers = approxTokenizersConfig()
	if edit != nil {
		edit(&cfg)
	}
	for i, engine := range engines {
		engine.Name, engine.Speed, engine.Seed, engine.DefaultMaxTokens = fmt.Sprint("w", i), 20, uint64(i+1), 8
		engine.Engine = sim.Config{NumGPUBlocks: 512, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 4096}
		s, err := mockworker.New(engine)
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		cfg.Router.Workers = append(cfg.Router.Workers, router.Worker{Name: engine.Name, Address: strings.TrimPrefix(srv.URL, "http://"),
			Models: workerModels, CapacityBlocks: 512})
	}
	require.NoError(t, cfg.Validate())
	a, err := build(cfg, nil, discardLogger())
	require.NoError(t, err)
	grpcAddr, adminAddr = serveOnLoopback(t, a)
	return a, grpcAddr, adminAddr
}

// TestAdaptersGoOnlyToTheWorkersThatLoadedThem: three simulated vLLM workers serve one
// base model and different LoRA adapters (w0 sql, w1 chat, w2 sql and tools), list
// them on /v1/models as vLLM does, and answer vLLM's 404 for an adapter they have not
// loaded. kvroute declares sql and chat only. Through Envoy (envoytest), bursts of
// concurrent requests, which load alone would spread over all three workers, each go
// to a worker that lists their adapter: none is lost to a 404, and tools, declared
// nowhere, routes on its base model as the engines' lists name it.
// waitForModelLists waits until kvroute has read the workers' model lists.
func waitForModelLists(t *testing.T, a *app, workers ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, w := range workers {
			if _, known := a.models.Models(w); !known {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "kvroute never read the workers' model lists")
}

func TestAdaptersGoOnlyToTheWorkersThatLoadedThem(t *testing.T) {
	var engines []mockworker.Config
	for _, adapters := range []map[string]string{{"sql": "qwen"}, {"chat": "qwen"}, {"sql": "qwen", "tools": "qwen"}} {
		engines = append(engines, mockworker.Config{LoRAAdapters: adapters, ServedModels: []string{"qwen"}})
	}
	a, grpcAddr, adminAddr := engineFleet(t, engines, []string{"qwen"}, true, func(cfg *config.Config) {
		// poem is declared, but no engine has loaded it: its requests go to every worker
		// (an engine with a LoRA resolver would load it) and are counted as unlisted.
		cfg.Router.LoRAAdapters = []router.LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}, {Name: "poem", BaseModel: "qwen"}}
	})
	waitForModelLists(t, a, "w0", "w1", "w2")
	client := clientThroughEnvoy(t, grpcAddr)

	const burst = 9
	for _, tt := range []struct {
		model        string
		wantWorkers  []string // the workers that may serve it
		wantLoRA     string
		wantUnlisted bool
	}{
		{"sql", []string{"w0", "w2"}, "sql", false},
		{"chat", []string{"w1"}, "chat", false},
		{"tools", []string{"w2"}, "tools", false},
		{"qwen", []string{"w0", "w1", "w2"}, "", false},
		{"poem", []string{"w0", "w1", "w2"}, "poem", true},
	} {
		t.Run(tt.model, func(t *testing.T) {
			var mu sync.Mutex
			servedBy := map[string]int{}
			var wg sync.WaitGroup
			for i := range burst {
				wg.Go(func() {
					var resp *http.Response
					_, err := client.Chat.Completions.New(context.Background(),
						openai.ChatCompletionNewParams{Model: tt.model, Messages: messages(fmt.Sprint(tt.model, " topic ", i)), MaxTokens: openai.Int(8)},
						option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
					var apiErr *openai.Error
					if tt.wantUnlisted && errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound {
						// The engine's own 404 (no worker has loaded poem), with the
						// decision that sent it there.
						var trace explain.Trace
						if assert.NoError(t, json.Unmarshal([]byte(apiErr.Response.Header.Get(explain.ResponseHeader)), &trace)) {
							assert.True(t, trace.LoRAUnlisted)
							assert.Len(t, trace.Candidates, 3)
						}
						return
					}
					if errors.As(err, &apiErr) {
						t.Errorf("request %d for %s: %d from %s: %s", i, tt.model, apiErr.StatusCode, apiErr.Response.Header.Get("x-served-by"), apiErr.Message)
						return
					}
					if !assert.NoError(t, err) {
						return
					}
					var trace explain.Trace
					if assert.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace)) {
						assert.Equal(t, "qwen", trace.Model)
						assert.Equal(t, tt.wantLoRA, trace.LoRA)
						assert.Equal(t, tt.wantUnlisted, trace.LoRAUnlisted)
						assert.Len(t, trace.Candidates, len(tt.wantWorkers), "only the workers that loaded %s are candidates", tt.model)
					}
					mu.Lock()
					servedBy[resp.Header.Get("x-served-by")]++
					mu.Unlock()
				})
			}
			wg.Wait()
			for w := range servedBy {
				assert.Contains(t, tt.wantWorkers, w, "%s went to %s, which has not loaded it", tt.model, w)
			}
		})
	}
	assert.Equal(t, 3.0, metricValue(t, a, "kvroute_engine_models_adapters", nil), "sql, chat and tools")
	assert.Equal(t, 3.0, metricValue(t, a, "kvroute_engine_models_known_lists", nil))

	// The admin port's fleet view says what each worker's engine has loaded.
	res, err := http.Get("http://" + adminAddr + "/workers")
	require.NoError(t, err)
	defer res.Body.Close()
	var view struct {
		Workers []struct {
			Name           string   `json:"name"`
			ListKnown      bool     `json:"list_known"`
			ListedAdapters []string `json:"listed_adapters"`
		} `json:"workers"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&view))
	require.Len(t, view.Workers, 3)
	for i, want := range [][]string{{"sql"}, {"chat"}, {"sql", "tools"}} {
		assert.True(t, view.Workers[i].ListKnown)
		assert.Equal(t, want, view.Workers[i].ListedAdapters, view.Workers[i].Name)
	}
	assert.Equal(t, float64(burst), metricValue(t, a, "kvroute_filter_lora_unlisted_total", nil), "every poem request, and only those")
}

// TestModelsGoOnlyToTheWorkersWhoseEnginesServeThem: three simulated vLLM workers,
// configured without models (kvroute would take each to serve every model), serve
// different models (w0 qwen, w1 llama, w2 both), list them on /v1/models and answer
// vLLM's 404 for any other. Through Envoy (envoytest), bursts of concurrent requests,
// which load alone would spread over all three, each go to a worker that serves their
// model, and a model no engine serves still goes to every worker (the engines answer),
// counted as unlisted. Without the lists, 6 to 8 of the 18 qwen and llama requests got
// 404 over 15 runs.
func TestModelsGoOnlyToTheWorkersWhoseEnginesServeThem(t *testing.T) {
	var engines []mockworker.Config
	for _, models := range [][]string{{"qwen"}, {"llama"}, {"qwen", "llama"}} {
		engines = append(engines, mockworker.Config{ServedModels: models})
	}
	for _, withLists := range []bool{true, false} {
		t.Run(fmt.Sprint("lists=", withLists), func(t *testing.T) {
			a, grpcAddr, _ := engineFleet(t, engines, nil, withLists, nil)
			if withLists {
				waitForModelLists(t, a, "w0", "w1", "w2")
			}
			client := clientThroughEnvoy(t, grpcAddr)

			const burst = 9
			lost := 0
			for _, tt := range []struct {
				model       string
				wantWorkers []string // the workers that serve it
			}{
				{"qwen", []string{"w0", "w2"}},
				{"llama", []string{"w1", "w2"}},
				{"mistral", nil},
			} {
				var mu sync.Mutex
				servedBy := map[string]int{}
				var wg sync.WaitGroup
				for i := range burst {
					wg.Go(func() {
						var resp *http.Response
						_, err := client.Chat.Completions.New(context.Background(),
							openai.ChatCompletionNewParams{Model: tt.model, Messages: messages(fmt.Sprint(tt.model, " topic ", i)), MaxTokens: openai.Int(8)},
							option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
						var apiErr *openai.Error
						if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusNotFound {
							// The engine's own 404, with the decision that sent it there.
							var trace explain.Trace
							if assert.NoError(t, json.Unmarshal([]byte(apiErr.Response.Header.Get(explain.ResponseHeader)), &trace)) && tt.wantWorkers == nil {
								assert.Equal(t, withLists, trace.ModelUnlisted)
								assert.Len(t, trace.Candidates, 3)
							}
							mu.Lock()
							lost++
							mu.Unlock()
							return
						}
						if !assert.NoError(t, err) {
							return
						}
						var trace explain.Trace
						if assert.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace)) {
							assert.False(t, trace.ModelUnlisted)
							if withLists {
								assert.Len(t, trace.Candidates, len(tt.wantWorkers), "only the workers that serve %s are candidates", tt.model)
							}
						}
						mu.Lock()
						servedBy[resp.Header.Get("x-served-by")]++
						mu.Unlock()
					})
				}
				wg.Wait()
				for w := range servedBy {
					assert.Contains(t, tt.wantWorkers, w, "%s went to %s, which does not serve it", tt.model, w)
				}
			}
			unlisted := metricValue(t, a, "kvroute_filter_model_unlisted_total", nil)
			if withLists {
				assert.Equal(t, burst, lost, "only the mistral requests, which no engine serves, are answered 404")
				assert.Equal(t, float64(burst), unlisted, "every mistral request, and only those")
			} else {
				assert.Greater(t, lost, burst, "without the lists load alone spreads qwen and llama over a worker that does not serve them")
				assert.Zero(t, unlisted)
				t.Logf("without the engines' lists %d of %d requests got 404 (%d of them for mistral)", lost, 3*burst, burst)
			}
		})
	}
}
