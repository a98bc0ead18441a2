package main

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

// ask sends a chat naming objective (none when ""), returning the worker that served
// it, or the API error kvroute answered.
func (d *deployment) ask(t *testing.T, objective string) (string, *openai.Error) {
	t.Helper()
	var opts []option.RequestOption
	if objective != "" {
		opts = append(opts, option.WithHeader("x-gateway-inference-objective", objective))
	}
	_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a request of " + objective)}}, opts...)
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return "", apiErr
	}
	require.NoError(t, err)
	exchanges := d.envoy.Exchanges()
	return d.byAddress[exchanges[len(exchanges)-1].Upstream], nil
}

// engineLoad is what a worker's engine says of its load: requests waiting, KV usage.
type engineLoad struct {
	waiting int
	kv      float64
}

// waitForEngineLoad waits until kvroute's scrapes read every worker's engine with this
// load: both numbers, since a change of one alone is not read until it is seen.
func (d *deployment) waitForEngineLoad(t *testing.T, loads map[string]engineLoad) {
	t.Helper()
	require.Eventually(t, func() bool {
		for name, want := range loads {
			if waiting, kv, _, ok := d.app.scraper.EngineLoad(name); !ok || waiting != want.waiting || kv != want.kv {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "the scrapes never read %v", loads)
}

// TestASaturatedFleetShedsSheddableRequestsAndServesCriticalOnes: the workers' engines
// report queues past GIE's threshold (scraped from their metrics pages): a request whose
// objective is sheddable gets the OpenAI 429 with retry-after, one of a critical
// objective, of an objective no one defines or of none is served; once one engine has
// room again, the sheddable request goes there.
func TestASaturatedFleetShedsSheddableRequestsAndServesCriticalOnes(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, func(c *config.Config) {
		c.EngineMetrics.Interval = 10 * time.Millisecond
		c.Priority.Objectives = map[string]int{"batch": -1, "chat": 10}
	})
	defer d.stop()
	for _, w := range d.workers {
		w.SetLoad(6, 0.5)
	}
	d.waitForEngineLoad(t, map[string]engineLoad{"w0": {6, 0.5}, "w1": {6, 0.5}, "w2": {6, 0.5}})

	_, apiErr := d.ask(t, "batch")
	require.NotNil(t, apiErr, "the sheddable request is refused")
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
	assert.Equal(t, "rate_limit_exceeded", apiErr.Code)
	assert.Equal(t, "1", apiErr.Response.Header.Get("retry-after"))
	for _, objective := range []string{"chat", "nightly", ""} {
		worker, apiErr := d.ask(t, objective)
		assert.Nil(t, apiErr, "objective %q is never shed for saturation", objective)
		assert.NotEmpty(t, worker)
	}
	metrics := d.scrape(t)
	assert.Contains(t, metrics, "kvroute_router_sheddable_shed_total 1")
	assert.Contains(t, metrics, `kvroute_filter_requests_total{outcome="rate_limit_exceeded"} 1`)

	d.workers["w1"].SetLoad(0, 0.1)
	d.waitForEngineLoad(t, map[string]engineLoad{"w1": {0, 0.1}})
	for range 3 {
		worker, apiErr := d.ask(t, "batch")
		require.Nil(t, apiErr)
		assert.Equal(t, "w1", worker, "only the worker with capacity takes sheddable requests")
	}
	d.requireNoLoad(t)
}

// A reload replaces the config's objectives: the next request of an objective that is
// no longer sheddable is served.
func TestReloadChangesTheObjectives(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.EngineMetrics.Interval = 10 * time.Millisecond
		c.Priority.Objectives = map[string]int{"batch": -1}
	})
	defer d.stop()
	for _, w := range d.workers {
		w.SetLoad(0, 0.95)
	}
	// The queues were already empty: waiting for them alone passed before the KV usage
	// was read (a CI run asked too early and was served).
	d.waitForEngineLoad(t, map[string]engineLoad{"w0": {0, 0.95}, "w1": {0, 0.95}, "w2": {0, 0.95}})
	_, apiErr := d.ask(t, "batch")
	require.NotNil(t, apiErr, "every KV cache past GIE's 80 %%")
	assert.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)

	next := d.running(t)
	next.Priority.Objectives = map[string]int{"batch": 0}
	status, summary := d.postReload(t, next, nil)
	require.Equal(t, http.StatusOK, status, summary)
	assert.Equal(t, true, summary["objectives"])
	assert.Equal(t, false, summary["policy"])
	_, apiErr = d.ask(t, "batch")
	assert.Nil(t, apiErr, "batch is no longer sheddable")

	next.Priority.QueueDepthThreshold = 9
	status, body := d.postReload(t, next, nil)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body["error"], "priority (but its objectives) changed: restart")
	d.requireNoLoad(t)
}

// TestWithHoldOnSaturationARequestWaitsForAnEngineWithRoom: with
// flow_control.hold_on_saturation, a request of priority 0 (no objective) finds every
// engine's queue past the threshold (scraped from their metrics pages) and is held
// rather than sent to a queue; once one engine reports room, it is served. It is not
// narrowed to that engine (README: routed among all, so a session keeps its worker):
// the default picker does not read the engines' queues, so any worker may serve it.
// Without the key it is served at once, as the shedding test shows.
func TestWithHoldOnSaturationARequestWaitsForAnEngineWithRoom(t *testing.T) {
	d := deploy(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, func(c *config.Config) {
		c.EngineMetrics.Interval = 10 * time.Millisecond
		c.FlowControl.Enabled, c.FlowControl.HoldOnSaturation = true, true
	})
	defer d.stop()
	for _, w := range d.workers {
		w.SetLoad(6, 0.5)
	}
	d.waitForEngineLoad(t, map[string]engineLoad{"w0": {6, 0.5}, "w1": {6, 0.5}, "w2": {6, 0.5}})

	done := d.holdOne(t, openai.UserMessage("a request of priority 0"))
	select {
	case err := <-done:
		t.Fatalf("answered while every engine was saturated: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	d.workers["w2"].SetLoad(0, 0.1)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was never served")
	}
	exchanges := d.envoy.Exchanges()
	assert.Contains(t, d.workers, d.byAddress[exchanges[len(exchanges)-1].Upstream], "served by a worker")
	metrics := d.scrape(t)
	assert.Contains(t, metrics, `kvroute_flow_control_requests_total{outcome="dispatched"} 1`)
	assert.NotContains(t, metrics, "kvroute_router_sheddable_shed_total 1")
	d.requireNoLoad(t)
}
