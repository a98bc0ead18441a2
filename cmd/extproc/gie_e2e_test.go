package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
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
