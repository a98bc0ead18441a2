package main

import (
	"context"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
