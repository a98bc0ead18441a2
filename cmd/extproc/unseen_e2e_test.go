package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/openai/openai-go/v3/option"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/explain"
)

// TestRequestsThatBypassKvrouteTakeTheirWorkersBatchSlots: clients calling two of the
// engines directly fill their batch slots, which kvroute's bookings cannot see; the
// engines' pages say so (running + waiting), and with engine_metrics.unseen_requests
// (the default) the kv cost counts them in N(w), so new requests go to the free
// engine. Off, the cost sees three idle workers.
func TestRequestsThatBypassKvrouteTakeTheirWorkersBatchSlots(t *testing.T) {
	for _, unseen := range []bool{true, false} {
		t.Run(fmt.Sprintf("unseen_requests=%v", unseen), func(t *testing.T) {
			d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
				c.EngineMetrics.Interval = 10 * time.Millisecond
				c.EngineMetrics.UnseenRequests = unseen
				c.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 2}
				for i := range c.Router.Workers {
					c.Router.Workers[i].MaxNumSeqs = 4
				}
			})
			defer d.stop()
			d.workers["w0"].SetRunning(4)   // every slot taken by traffic past kvroute
			d.workers["w1"].SetRunning(3)   // and these three...
			d.workers["w1"].SetLoad(2, 0.5) // ...with two more queued behind them
			n := 0
			var trace explain.Trace
			ask := func() string {
				t.Helper()
				n++
				var resp *http.Response
				_, err := d.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "qwen",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("%d %s", n, strings.Repeat("fresh ", 30)))}},
					option.WithHeader("x-why", "1"), option.WithResponseInto(&resp))
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
				exchanges := d.envoy.Exchanges()
				return d.byAddress[exchanges[len(exchanges)-1].Upstream]
			}
			byWorker := func() map[string]explain.Candidate {
				got := map[string]explain.Candidate{}
				for _, c := range trace.Candidates {
					got[c.Worker] = c
				}
				return got
			}
			if !unseen {
				// Wait for scrapes to have happened: the engines' pages are read (for their
				// capacity) but their requests are not counted.
				require.Eventually(t, func() bool { return strings.Contains(d.scrape(t), "kvroute_scoring_unseen_requests") }, 10*time.Second, 20*time.Millisecond)
				time.Sleep(50 * time.Millisecond)
				ask()
				for name, c := range byWorker() {
					assert.Zero(t, c.UnseenRequests, name)
					assert.Zero(t, c.Queued, "%s looks idle", name)
				}
				assert.Contains(t, d.scrape(t), `kvroute_scoring_unseen_requests{worker="w0"} 0`)
				d.requireNoLoad(t)
				return
			}
			require.Eventually(t, func() bool {
				m := d.scrape(t)
				return strings.Contains(m, `kvroute_scoring_unseen_requests{worker="w0"} 4`) && strings.Contains(m, `kvroute_scoring_unseen_requests{worker="w1"} 5`)
			}, 10*time.Second, 20*time.Millisecond, "the engines' running and waiting requests, none booked by kvroute")
			for range 12 {
				assert.Equal(t, "w2", ask(), "the engines past kvroute's traffic are full")
			}
			got := byWorker()
			assert.Equal(t, 4, got["w0"].UnseenRequests, "the decision trace shows them")
			assert.Equal(t, 4, got["w0"].ActiveRequests, "in N(w)")
			assert.Equal(t, 1, got["w0"].Queued, "4 of 4 slots taken: this request would wait")
			assert.Equal(t, 2, got["w1"].Queued, "behind the 2 queued there")
			d.workers["w0"].SetRunning(0)
			d.workers["w2"].SetRunning(8)
			require.Eventually(t, func() bool { return ask() == "w0" }, 10*time.Second, 20*time.Millisecond, "the next scrape moves traffic")
			d.requireNoLoad(t)
		})
	}
}
