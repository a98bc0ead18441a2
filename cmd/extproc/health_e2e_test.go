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

// fastHealth probes every 10 ms and backs off for 100 ms, so a test sees a worker go
// out and come back quickly.
func fastHealth(c *config.Config) {
	c.Health.Interval, c.Health.Timeout = 10*time.Millisecond, time.Second
	c.Health.BackoffMin, c.Health.BackoffMax = 100*time.Millisecond, 200*time.Millisecond
}

func (d *deployment) eligible(t *testing.T, worker string) string {
	t.Helper()
	for _, line := range strings.Split(d.scrape(t), "\n") {
		if strings.HasPrefix(line, fmt.Sprintf("kvroute_worker_eligible{worker=%q} ", worker)) {
			return strings.Fields(line)[1]
		}
	}
	return "missing"
}

func TestFailingWorkersAreTakenOutAndRejoin(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, fastHealth)
	defer d.stop()
	ctx := context.Background()
	conversation := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(strings.Repeat("You answer questions about the routing of LLM requests. ", 12)),
		openai.UserMessage("What is a KV cache?"),
	}
	ask := func() string {
		t.Helper()
		resp, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: conversation})
		require.NoError(t, err, "no request is lost while a worker is out")
		exchanges := d.envoy.Exchanges()
		conversation = append(conversation, openai.AssistantMessage(resp.Choices[0].Message.Content), openai.UserMessage("and then?"))
		return d.byAddress[exchanges[len(exchanges)-1].Upstream]
	}
	holder := ask()
	require.Equal(t, holder, ask(), "a healthy holder keeps its session")

	// The holder's health endpoint fails: the probes take it out, and the session moves.
	d.workers[holder].SetHealthy(false)
	require.Eventually(t, func() bool { return d.eligible(t, holder) == "0" }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return d.app.index.WorkerEntries(holder) == 0 }, 10*time.Second, 5*time.Millisecond,
		"a worker that goes out loses its index entries (it may come back empty)")
	moved := ask()
	assert.NotEqual(t, holder, moved)
	assert.Regexp(t, `kvroute_worker_health_failures_total\{source="probe",worker="`+holder+`"\} [1-9]`, d.scrape(t))

	// Healthy again: back after its back-off.
	d.workers[holder].SetHealthy(true)
	require.Eventually(t, func() bool { return d.eligible(t, holder) == "1" }, 10*time.Second, 5*time.Millisecond)

	// A worker that answers requests with 5xx is taken out by the responses themselves
	// (its health endpoint still says 200): two in a row, on the worker holding this
	// prefix.
	failing := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("FAIL_UPSTREAM " + strings.Repeat("same prefix ", 20))}
	var failedOn []string
	for range 2 {
		_, err := d.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: failing})
		require.Error(t, err, "the upstream's 503 reaches the client")
		exchanges := d.envoy.Exchanges()
		failedOn = append(failedOn, d.byAddress[exchanges[len(exchanges)-1].Upstream])
	}
	require.Equal(t, failedOn[0], failedOn[1], "the second try went back to the prefix's holder")
	assert.Contains(t, d.scrape(t), fmt.Sprintf("kvroute_worker_health_failures_total{source=\"response\",worker=%q} 2", failedOn[0]))
	// The probes bring it back once the back-off ends; no need to wait for that here.
	d.requireNoLoad(t)
}

func TestADeadWorkerIsTakenOutAndItsSessionsMove(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, fastHealth)
	defer d.stop()
	ctx := context.Background()
	prompt := openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a long shared document ", 30))}
	_, err := d.client.Completions.New(ctx, openai.CompletionNewParams{Model: "qwen", Prompt: prompt})
	require.NoError(t, err)
	exchanges := d.envoy.Exchanges()
	holder := d.byAddress[exchanges[len(exchanges)-1].Upstream]

	d.workers[holder].Close() // the process is gone: connections are refused
	require.Eventually(t, func() bool { return d.eligible(t, holder) == "0" }, 10*time.Second, 5*time.Millisecond)
	for range 3 {
		_, err := d.client.Completions.New(ctx, openai.CompletionNewParams{Model: "qwen", Prompt: prompt})
		require.NoError(t, err, "requests go to the live workers")
		exchanges := d.envoy.Exchanges()
		assert.NotEqual(t, holder, d.byAddress[exchanges[len(exchanges)-1].Upstream])
	}
	assert.Equal(t, "0", d.eligible(t, holder), "a dead worker stays out: the end of its back-off is not enough")
	d.requireNoLoad(t)
}
