package main

import (
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// routedTerms returns the chosen candidate's terms in the last "routed" line of the
// decision trace, with the prompt blocks it is missing under "missing" (the cost
// counts a partial last block: deployments' blocks are of 4 tokens).
func routedTerms(t *testing.T, logs *lockedBuffer) map[string]float64 {
	t.Helper()
	var last map[string]float64
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var entry struct {
			Msg      string `json:"msg"`
			Decision struct {
				PromptTokens float64          `json:"prompt_tokens"`
				Candidates   []map[string]any `json:"candidates"`
			} `json:"decision"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "routed" || len(entry.Decision.Candidates) == 0 {
			continue
		}
		last = map[string]float64{}
		for k, v := range entry.Decision.Candidates[0] {
			if f, ok := v.(float64); ok {
				last[k] = f
			}
		}
		last["missing"] = math.Ceil(entry.Decision.PromptTokens/4) - last["overlap"]
	}
	require.NotNil(t, last, "a decision was traced")
	return last
}

// TestARouteOverrideAppliesOnTopOfThePolicyInForceAtTheDecision: a request on a route
// with a policy override (x-kvroute-policy) is priced with the route's keys on top of
// the policy in force when it is decided, not when its stream began. A request held
// by flow control while the policy changes (PUT /policy, or a reload) is decided with
// the new policy's other keys, as a request on a route without an override is; the
// route's own keys still win.
func TestARouteOverrideAppliesOnTopOfThePolicyInForceAtTheDecision(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, d *deployment)
	}{
		{"PUT /policy", func(t *testing.T, d *deployment) {
			req, err := http.NewRequest(http.MethodPut, d.adminURL+"/policy", strings.NewReader(`{"prefill_load_scale": 0, "prefix_affinity_weight": 9}`))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
		}},
		{"POST /reload", func(t *testing.T, d *deployment) {
			next := d.running(t)
			next.Router.Workers = append(next.Router.Workers[:0:0], next.Router.Workers...)
			next.Policy.PrefillLoadScale, next.Policy.PrefixAffinityWeight = 0, 9
			status, summary := d.postReload(t, next, nil)
			require.Equal(t, http.StatusOK, status, summary)
			require.Equal(t, true, summary["policy"])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			d := deployEnvoy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED,
				func(c *config.Config) { c.Router.MaxActiveRequestsPerWorker, c.FlowControl.Enabled = 1, true },
				func(c *envoytest.Config) {
					c.Routes = []envoytest.Route{{PathPrefix: "/v1/", GRPCInitialMetadata: map[string]string{filter.PolicyMetadataKey: `{"prefix_affinity_weight": 2}`}}}
				}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
			defer d.stop()
			cancels := d.fillWorkers(t)
			before := routedTerms(t, logs)
			require.Positive(t, before["prefill"], "the policy in force prices prefill")
			require.Positive(t, before["affinity"])
			require.Positive(t, before["missing"])
			assert.Equal(t, 2*before["missing"], before["affinity"], "the route's prefix_affinity_weight")

			done := d.holdOne(t, openai.UserMessage("held while the policy changes "+strings.Repeat("x ", 20)))
			tt.change(t, d)
			cancels[0]()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the held request was never served")
			}
			held := routedTerms(t, logs)
			assert.Zero(t, held["prefill"], "the held request is priced with the policy in force at its decision (prefill_load_scale 0)")
			require.Positive(t, held["missing"])
			assert.Equal(t, 2*held["missing"], held["affinity"], "the route's own key still wins over the new policy's 9")
			for _, cancel := range cancels {
				cancel()
			}
			d.waitForNoBookings(t)
		})
	}
}
