package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

func TestSheddingAnswers429WhenEveryWorkerIsFull(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker = 1 })
	defer d.stop()

	// One generation in flight on each of the three workers fills them.
	var cancels []context.CancelFunc
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		defer cancel()
		stream := d.client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("HANG_AFTER_FIRST_TOKEN %d", i))}})
		require.True(t, stream.Next(), "stream %d started", i)
	}

	_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one more")}})
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	assert.Equal(t, 429, apiErr.StatusCode)
	assert.Equal(t, "rate_limit_exceeded", apiErr.Code)
	assert.Equal(t, "1", apiErr.Response.Header.Get("retry-after"))
	assert.Contains(t, d.scrape(t), `kvroute_filter_requests_total{outcome="rate_limit_exceeded"} 1`)

	// A finished generation frees its slot.
	cancels[0]()
	require.Eventually(t, func() bool {
		_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one more")}})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	for _, cancel := range cancels {
		cancel()
	}
	d.waitForNoBookings(t)
}
