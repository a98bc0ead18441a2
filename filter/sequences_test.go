package filter_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// A request the engine runs as several sequences (GRPO-style n samples of a rollout's
// prompt, a batch of prompts) takes as many batch slots in the booked load while it
// runs, on every API that asks for them, and gives them all back at its end.
func TestParallelSamplesTakeTheirBatchSlots(t *testing.T) {
	for _, tt := range []struct {
		name, path, body string
		headers          []string
		want             int
	}{
		{"a chat's n", "/v1/chat/completions",
			`{"model":"m","n":8,"stream":true,"messages":[{"role":"user","content":"HANG_AFTER_FIRST_TOKEN"}]}`, nil, 8},
		{"a completions batch", "/v1/completions",
			`{"model":"m","stream":true,"prompt":["HANG_AFTER_FIRST_TOKEN a","b","c"]}`, nil, 3},
		{"vLLM generate's n", "/inference/v1/generate",
			`{"model":"m","stream":true,"token_ids":[1,2,3],"sampling_params":{"n":16},"x":"HANG_AFTER_FIRST_TOKEN"}`, nil, 16},
		{"SGLang's batch of n each", "/generate",
			`{"stream":true,"text":["HANG_AFTER_FIRST_TOKEN","b"],"sampling_params":{"n":4}}`, []string{"x-gateway-model-name", "m"}, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.envoy.URL+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			for i := 0; i+1 < len(tt.headers); i += 2 {
				req.Header.Set(tt.headers[i], tt.headers[i+1])
			}
			resp, err := p.envoy.Client().Do(req)
			require.NoError(t, err)
			_, err = bufio.NewReader(resp.Body).ReadString('\n') // the first token: W is back to none
			require.NoError(t, err)
			var booked scoring.Load
			for _, w := range p.workers {
				l := p.bookings.Load(w.name)
				booked.ActiveRequests += l.ActiveRequests
				booked.PendingRequests += l.PendingRequests
			}
			assert.Equal(t, scoring.Load{ActiveRequests: tt.want}, booked, "N counts every sequence while it runs")
			cancel()
			resp.Body.Close()
			p.waitIdle(t)
		})
	}
}
