package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
)

// TestADeadWorkerWithoutProbesIsTakenOutByEnvoysLocalReplies plays a worker whose
// process is gone, with probes off, as Envoy from 1.37 (and before 1.33.1) drives it: the
// router's "upstream connect error" 503 is a local reply that goes through the ext_proc
// filter (envoytest: routerReply), so kvroute sees it as the chosen worker's response.
// Each such request reaches the client as Envoy's 503, its booking is released as an
// upstream error, and unhealthy_threshold of them take the worker out; the session
// then goes to a live worker.
func TestADeadWorkerWithoutProbesIsTakenOutByEnvoysLocalReplies(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, func(c *config.Config) {
				c.Health.Interval = 0 // no probes: only routed responses tell
				c.Health.BackoffMin, c.Health.BackoffMax = time.Minute, time.Minute
			})
			defer d.stop()
			baseline := d.goroutineBaseline(t)
			prompt := "the shared document " + strings.Repeat("about KV caches ", 40)
			status, body := d.chat(t, context.Background(), prompt, false)
			require.Equal(t, http.StatusOK, status, body)
			holder := d.byAddress[d.lastExchange().Upstream]

			d.workers[holder].Close() // connections to it are refused
			for i := range 2 {
				status, body := d.chat(t, context.Background(), prompt, false)
				require.Equal(t, http.StatusServiceUnavailable, status, "try %d: Envoy's 503 reaches the client: %s", i, body)
				assert.Contains(t, body, "upstream connect error or disconnect/reset before headers")
				ex := d.lastExchange()
				assert.Equal(t, holder, d.byAddress[ex.Upstream], "the prefix's holder was chosen")
				assert.True(t, ex.LocalReply)
			}
			assert.Equal(t, "2", d.counter(t, "kvroute_worker_health_failures_total", fmt.Sprintf(`{source="response",worker=%q}`, holder)))
			assert.Equal(t, "2", d.counter(t, "kvroute_filter_completions_total", fmt.Sprintf(`{outcome="upstream_error",worker=%q}`, holder)))
			require.Eventually(t, func() bool { return d.eligible(t, holder) == "0" }, settleDeadline, 5*time.Millisecond)

			status, body = d.chat(t, context.Background(), prompt, false)
			require.Equal(t, http.StatusOK, status, body)
			assert.NotEqual(t, holder, d.byAddress[d.lastExchange().Upstream], "the session moved to a live worker")
			d.requireRecovered(t, baseline)
		})
	}
}

// TestRouteTimeoutIsAnUpstreamErrorOfTheChosenWorker plays Envoy's route timeout
// before the response headers: the router's 504 goes through the ext_proc filter, and
// kvroute releases the booking as an upstream error.
func TestRouteTimeoutIsAnUpstreamErrorOfTheChosenWorker(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deployEnvoy(t, m.req, m.resp, nil, func(c *envoytest.Config) {
				c.Routes = []envoytest.Route{{PathPrefix: "/", Timeout: 200 * time.Millisecond}}
			}, discardLogger())
			defer d.stop()
			baseline := d.goroutineBaseline(t)
			// The worker sends no headers until the request ends.
			status, body := d.chat(t, context.Background(), "HANG_BEFORE_FIRST_TOKEN", false)
			require.Equal(t, http.StatusGatewayTimeout, status, body)
			assert.Equal(t, "upstream request timeout", body)
			worker := d.byAddress[d.lastExchange().Upstream]
			assert.Equal(t, "1", d.counter(t, "kvroute_filter_completions_total", fmt.Sprintf(`{outcome="upstream_error",worker=%q}`, worker)))
			d.requireRecovered(t, baseline)
		})
	}
}

func (d *deployment) lastExchange() *envoytest.Exchange {
	ex := d.envoy.Exchanges()
	return ex[len(ex)-1]
}

// TestLocalRepliesKvrouteNeverSees plays the Envoy releases that keep local replies
// from the processor (1.34 to 1.36, envoytest.Config.SkipLocalReplies) and the 413 of
// a request past the buffer limit, which reaches kvroute before the request body: every
// booking is still released and nothing is left behind.
func TestLocalRepliesKvrouteNeverSees(t *testing.T) {
	t.Run("skipped 503", func(t *testing.T) {
		d := deployEnvoy(t, e2eModes[0].req, e2eModes[0].resp, func(c *config.Config) { c.Health.Interval = 0 },
			func(c *envoytest.Config) { c.SkipLocalReplies = true }, discardLogger())
		defer d.stop()
		baseline := d.goroutineBaseline(t)
		prompt := "the shared document " + strings.Repeat("about KV caches ", 40)
		status, _ := d.chat(t, context.Background(), prompt, false)
		require.Equal(t, http.StatusOK, status)
		holder := d.byAddress[d.lastExchange().Upstream]
		d.workers[holder].Close()
		status, _ = d.chat(t, context.Background(), prompt, false)
		require.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, "0", d.counter(t, "kvroute_worker_health_failures_total", fmt.Sprintf(`{source="response",worker=%q}`, holder)),
			"kvroute never saw the 503")
		d.requireRecovered(t, baseline)
	})
	t.Run("413 before the request body", func(t *testing.T) {
		d := deployEnvoy(t, e2eModes[0].req, e2eModes[0].resp, nil, func(c *envoytest.Config) { c.BufferLimit = 1 << 10 }, discardLogger())
		defer d.stop()
		baseline := d.goroutineBaseline(t)
		status, _ := d.chat(t, context.Background(), strings.Repeat("too long ", 400), false)
		require.Equal(t, http.StatusRequestEntityTooLarge, status)
		assert.True(t, d.lastExchange().LocalReply)
		status, body := d.chat(t, context.Background(), "a short one", false)
		require.Equal(t, http.StatusOK, status, body)
		d.requireRecovered(t, baseline)
	})
}
