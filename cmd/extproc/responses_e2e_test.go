package main

import (
	"context"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

// TestResponsesChainThroughEnvoyAndKvroute: OpenAI's client runs a Responses API
// conversation by previous_response_id, streamed and not, through the data plane and
// kvroute to three workers that each keep their responses in their own memory, as
// vLLM does: every turn, and the GET of the last response, reaches the worker that
// stored what it names (any other answers 404).
func TestResponsesChainThroughEnvoyAndKvroute(t *testing.T) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			d := deploy(t, m.req, m.resp, nil)
			defer d.stop()
			ctx := context.Background()
			previous := ""
			for turn := range 6 {
				params := responses.ResponseNewParams{Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("next")}}
				if previous != "" {
					params.PreviousResponseID = openai.String(previous)
				}
				if turn%2 == 0 {
					r, err := d.client.Responses.New(ctx, params)
					require.NoError(t, err, "turn %d", turn)
					previous = r.ID
					continue
				}
				stream := d.client.Responses.NewStreaming(ctx, params)
				for stream.Next() {
					if ev := stream.Current(); ev.Type == "response.completed" {
						previous = ev.AsResponseCompleted().Response.ID
					}
				}
				require.NoError(t, stream.Err(), "turn %d", turn)
			}
			got, err := d.client.Responses.Get(ctx, previous, responses.ResponseGetParams{})
			require.NoError(t, err)
			assert.Equal(t, previous, got.ID)

			metrics := d.scrape(t)
			assert.Contains(t, metrics, `kvroute_router_stored_response_requests_total{routed="stored_worker"} 6`, "5 turns and the GET")
			assert.Contains(t, metrics, `kvroute_router_stored_response_requests_total{routed="unknown"} 0`)
			assert.Equal(t, 6.0, d.gaugeSum(t, "kvroute_responses_entries"))
			stored := 0
			for _, w := range d.workers {
				for _, id := range w.StoredResponses() {
					stored++
					assert.True(t, strings.HasPrefix(id, "resp_"+w.Name+"_"))
				}
			}
			assert.Equal(t, 6, stored)
		})
	}
}

// TestReplicasSendAChainToTheWorkerThatStoredIt: two kvroute replicas (peers,
// share_blocks) take turns at a Responses API conversation, as Envoy may send each
// turn to either: each replica tells the other which worker stored each response, so
// every turn, whichever replica routes it, reaches the worker that stored the one it
// continues.
func TestReplicasSendAChainToTheWorkerThatStoredIt(t *testing.T) {
	const buffered, streamed = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED
	a, b := deployPeers(t, buffered, streamed, func(c *config.Config) { c.Peers.ShareBlocks = true })
	defer a.stop()
	defer b.stop()

	ctx := context.Background()
	previous := ""
	for turn := range 6 {
		via, other := a, b
		if turn%2 == 1 {
			via, other = b, a
		}
		params := responses.ResponseNewParams{Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("next")}}
		if previous != "" {
			params.PreviousResponseID = openai.String(previous)
		}
		r, err := via.client.Responses.New(ctx, params)
		require.NoError(t, err, "turn %d", turn)
		previous = r.ID
		// The next turn goes to the other replica once it has heard of this response.
		require.Eventually(t, func() bool { return other.gaugeSum(t, "kvroute_responses_entries") == float64(turn+1) },
			10*time.Second, 10*time.Millisecond, "turn %d's response reaches the other replica", turn)
	}
	// A routed turns 0, 2 and 4, B turns 1, 3 and 5: each heard of the other's three
	// responses, and B of turn 0's blocks too (the only turn routed on its prompt: the
	// others continue a stored response).
	assert.Equal(t, "4", b.counter(t, "kvroute_peers_records_received_total", `{result="stored"}`))
	assert.Equal(t, "3", a.counter(t, "kvroute_peers_records_received_total", `{result="stored"}`))
	for _, d := range []*deployment{a, b} {
		assert.Equal(t, "0", d.counter(t, "kvroute_router_stored_response_requests_total", `{routed="unknown"}`))
	}
	assert.Equal(t, "3", b.counter(t, "kvroute_router_stored_response_requests_total", `{routed="stored_worker"}`))
	assert.Equal(t, "2", a.counter(t, "kvroute_router_stored_response_requests_total", `{routed="stored_worker"}`))
}
