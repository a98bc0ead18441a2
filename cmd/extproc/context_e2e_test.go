package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/scoring"
)

// TestPromptsGoWhereTheyFitTheEnginesContext: two simulated vLLM workers of one model
// started with different --max-model-len (w0 256 tokens, w1 2,048) list it on
// /v1/models as vLLM does and refuse a longer prompt with vLLM's 400. Through Envoy
// (envoytest), a burst of 500-token prompts, which load alone would spread over both,
// all go to w1, where they fit; a burst of 3,000-token prompts, which fit neither, gets
// the engines' 400 and leaves nothing behind: no booking, no block recorded for a
// prompt no engine computed. Token-id prompts: their length is exact.
func TestPromptsGoWhereTheyFitTheEnginesContext(t *testing.T) {
	engines := []mockworker.Config{{MaxModelLen: 256, ServedModels: []string{"m"}}, {MaxModelLen: 2048, ServedModels: []string{"m"}}}
	a, grpcAddr, _ := engineFleet(t, engines, nil, true, nil)
	waitForModelLists(t, a, "w0", "w1")
	client := clientThroughEnvoy(t, grpcAddr)

	prompt := func(n, from int) openai.CompletionNewParamsPromptUnion {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = int64(from + i)
		}
		return openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: ids}
	}
	const burst = 8
	for _, tt := range []struct {
		name         string
		tokens       int
		maxTokens    int64
		wantStatus   int
		wantNarrowed bool
		wantExceeded bool
		wantError    string
	}{
		{"fits w1 only", 500, 4, http.StatusOK, true, false, ""},
		{"fits w1 only with its max_tokens", 200, 100, http.StatusOK, true, false, ""},
		{"fits neither", 3000, 4, http.StatusBadRequest, false, true, "However, you requested 3000 tokens"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			entries := a.index.WorkerEntries("w0") + a.index.WorkerEntries("w1")
			pastContext := func(candidates string) float64 {
				return metricValue(t, a, "kvroute_router_prompts_past_context_total", map[string]string{"candidates": candidates})
			}
			some, all := pastContext("some"), pastContext("all")
			var mu sync.Mutex
			servedBy := map[string]int{}
			var wg sync.WaitGroup
			for i := range burst {
				wg.Go(func() {
					var resp *http.Response
					_, err := client.Completions.New(context.Background(),
						openai.CompletionNewParams{Model: "m", Prompt: prompt(tt.tokens, 1000*i), MaxTokens: openai.Int(tt.maxTokens)},
						option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
					header := resp.Header
					var apiErr *openai.Error
					switch {
					case tt.wantStatus == http.StatusOK && !assert.NoError(t, err):
						return
					case tt.wantStatus != http.StatusOK:
						if !assert.True(t, errors.As(err, &apiErr), "%v", err) {
							return
						}
						assert.Equal(t, tt.wantStatus, apiErr.StatusCode)
						assert.Contains(t, apiErr.Message, tt.wantError, "the engine's own refusal")
						header = apiErr.Response.Header
					}
					var trace explain.Trace
					if assert.NoError(t, json.Unmarshal([]byte(header.Get(explain.ResponseHeader)), &trace)) {
						assert.Equal(t, tt.wantNarrowed, trace.ContextNarrowed)
						assert.Equal(t, tt.wantExceeded, trace.ContextExceeded)
						mu.Lock()
						servedBy[trace.Worker]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if tt.wantNarrowed {
				assert.Equal(t, map[string]int{"w1": burst}, servedBy, "every prompt went where it fits")
			}
			for _, w := range []string{"w0", "w1"} {
				assert.Equal(t, scoring.Load{}, a.bookings.Load(w), "%s: every booking released", w)
			}
			if tt.wantExceeded {
				assert.Equal(t, entries, a.index.WorkerEntries("w0")+a.index.WorkerEntries("w1"), "no block recorded for a refused prompt")
				assert.Equal(t, float64(burst), pastContext("all")-all)
			} else {
				assert.Equal(t, float64(burst), pastContext("some")-some)
			}
		})
	}
}
