package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

func TestGIEPickerScoresWithScrapedEngineMetrics(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Policy.Picker = "gie"
		c.EngineMetrics.Interval = 10 * time.Millisecond
	})
	defer d.stop()
	ctx := context.Background()
	// Every request has its own prompt: a repeated one would be held by wherever it
	// first landed (before the first scrape, at random), and the prefix term (×3) can
	// outweigh the queue and KV terms.
	n := 0
	ask := func() string {
		t.Helper()
		n++
		_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("%d %s", n, strings.Repeat("fresh ", 30)))}})
		require.NoError(t, err)
		exchanges := d.envoy.Exchanges()
		return d.byAddress[exchanges[len(exchanges)-1].Upstream]
	}
	// Traffic from elsewhere queues on w0 and w1 (kvroute's own bookings cannot see it):
	// the GIE scorer sends new requests to w2.
	d.workers["w0"].SetLoad(30, 0.9)
	d.workers["w1"].SetLoad(20, 0.8)
	d.workers["w2"].SetLoad(0, 0.1)
	require.Eventually(t, func() bool { return ask() == "w2" }, 10*time.Second, 20*time.Millisecond)
	for range 3 {
		assert.Equal(t, "w2", ask(), "the idle engine wins while the others report queues")
	}

	d.workers["w2"].SetLoad(40, 0.95)
	d.workers["w0"].SetLoad(0, 0.05)
	require.Eventually(t, func() bool { return ask() == "w0" }, 10*time.Second, 20*time.Millisecond, "the next scrape moves traffic")
	d.requireNoLoad(t)
}

// TestGIEPickerNeverScoresWithUntrustworthyEngineMetrics: an engine whose page reports a
// NaN KV usage, or a queue no engine could hold, is read as unknown (0) by the gie
// picker rather than turning its cost into NaN or a garbage integer; the operator is
// warned.
func TestGIEPickerNeverScoresWithUntrustworthyEngineMetrics(t *testing.T) {
	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Policy.Picker = "gie"
		c.EngineMetrics.Interval = 10 * time.Millisecond
	}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()
	d.workers["w0"].SetLoad(0, math.NaN())
	d.workers["w1"].SetLoad(1<<40, 0.3)
	d.workers["w2"].SetLoad(5, 0.5)

	n := 0
	terms := func() map[string]map[string]any {
		t.Helper()
		n++
		_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("%d %s", n, strings.Repeat("fresh ", 30)))}})
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		var last string
		for _, line := range lines {
			if strings.Contains(line, `"msg":"routed"`) {
				last = line
			}
		}
		var entry struct {
			Decision struct {
				Candidates []map[string]any `json:"candidates"`
			} `json:"decision"`
		}
		require.NoError(t, json.Unmarshal([]byte(last), &entry), "the decision trace encodes (NaN does not): %s", last)
		byWorker := map[string]map[string]any{}
		for _, c := range entry.Decision.Candidates {
			byWorker[c["worker"].(string)] = c
		}
		return byWorker
	}
	// Wait for a scrape of the sane worker to reach a decision.
	var got map[string]map[string]any
	require.Eventually(t, func() bool { got = terms(); return got["w2"]["waiting"] == 5.0 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0.0, got["w0"]["kv_utilization"], "a NaN usage reads as unknown")
	assert.Equal(t, 0.0, got["w1"]["waiting"], "a 2^40 queue reads as unknown")
	for name, c := range got {
		cost, ok := c["cost"].(float64)
		require.True(t, ok, "%s's cost is a number: %v", name, c["cost"])
		assert.False(t, math.IsNaN(cost) || math.IsInf(cost, 0), "%s's cost %v", name, cost)
	}
	// The workers are scraped concurrently: w2's reading can reach a decision before
	// the refusal of w0's or w1's page is logged.
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"engine metrics refused`) },
		10*time.Second, 10*time.Millisecond, "the operator is warned")
	d.requireNoLoad(t)
}

// TestStartupWarnsWhenTheGIEPickerReadsStaleQueues: the gie picker scores with the
// engines' scraped queues, which every decision between two scrapes reads the same; at
// kvroute's default 1 s interval that piles requests onto one worker, so kvroute warns
// at start, and only for a picker that reads them.
func TestStartupWarnsWhenTheGIEPickerReadsStaleQueues(t *testing.T) {
	tests := []struct {
		picker   string
		interval time.Duration
		warned   bool
	}{
		{"gie", time.Second, true},
		{"gie", 250 * time.Millisecond, true},
		{"gie", 100 * time.Millisecond, false},
		{"gie", 50 * time.Millisecond, false},
		{"kv", time.Second, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s every %s", tt.picker, tt.interval), func(t *testing.T) {
			cfg := config.Default()
			cfg.Router.Workers = []router.Worker{{Name: "w", Address: "127.0.0.1:1"}}
			cfg.Tokenizers = approxTokenizersConfig()
			cfg.Policy.Picker, cfg.EngineMetrics.Interval = tt.picker, tt.interval
			logs := &lockedBuffer{}
			_, err := build(cfg, nil, slog.New(slog.NewJSONHandler(logs, nil)))
			require.NoError(t, err)
			warned := strings.Contains(logs.String(), `"level":"WARN","msg":"engine_metrics.interval is `)
			assert.Equal(t, tt.warned, warned, logs.String())
		})
	}
}
