package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/rewrite"
)

// TestModelRewritesSplitAClientsModelBetweenItsTargets: the client asks for "lora",
// which no engine serves; the config splits it 1:1 between lora-v1 and lora-v2, each
// served by one simulated vLLM engine alone (any other model is its 404). Through Envoy
// (envoytest, BUFFERED), every request is served, each by the engine of the target its
// decision names, both targets are drawn, the response names "lora" (GIE's #2769),
// and the split is counted by rewrite and target.
func TestModelRewritesSplitAClientsModelBetweenItsTargets(t *testing.T) {
	engines := []mockworker.Config{{ServedModels: []string{"lora-v1"}}, {ServedModels: []string{"lora-v2"}}}
	a, grpcAddr, _ := engineFleet(t, engines, nil, true, func(cfg *config.Config) {
		cfg.ModelRewrites = rewrite.Config{{Name: "lora-canary", Rules: []rewrite.Rule{{Models: []string{"lora"},
			Targets: []rewrite.Target{{Model: "lora-v1", Weight: 1}, {Model: "lora-v2", Weight: 1}}}}}}
	})
	waitForModelLists(t, a, "w0", "w1")
	client := clientThroughEnvoy(t, grpcAddr)

	servedBy := map[string]int{}
	for i := range 16 {
		var resp *http.Response
		completion, err := client.Chat.Completions.New(context.Background(),
			openai.ChatCompletionNewParams{Model: "lora", Messages: messages(fmt.Sprint("topic ", i)), MaxTokens: openai.Int(8)},
			option.WithResponseInto(&resp), option.WithHeader("x-kvroute-explain", "1"))
		require.NoError(t, err, "no request reaches an engine that lacks its model")
		var trace explain.Trace
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
		require.NotNil(t, trace.Rewrite)
		assert.Equal(t, explain.RewriteTrace{Name: "lora-canary", From: "lora"}, *trace.Rewrite)
		want := map[string]string{"lora-v1": "w0", "lora-v2": "w1"}[trace.Model]
		assert.Equal(t, want, trace.Worker, "the target's engine: %s", trace.Model)
		assert.Equal(t, "lora", completion.Model, "the client sees the model it asked for, not the target its engine ran")
		servedBy[trace.Model]++
	}
	assert.Len(t, servedBy, 2, "both targets drawn: %v", servedBy)

	families, err := a.registry.Gather()
	require.NoError(t, err)
	counted := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "kvroute_rewrite_requests_total" {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				assert.Equal(t, "lora-canary", labels["rewrite"])
				counted[labels["target"]] += m.GetCounter().GetValue()
			}
		}
	}
	assert.Equal(t, map[string]float64{"lora-v1": float64(servedBy["lora-v1"]), "lora-v2": float64(servedBy["lora-v2"])}, counted)

	// A model no rule names is left alone: no engine serves it.
	_, err = client.Chat.Completions.New(context.Background(),
		openai.ChatCompletionNewParams{Model: "lora-v3", Messages: messages("x"), MaxTokens: openai.Int(8)})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, http.StatusNotFound, apiErr.StatusCode)
}
