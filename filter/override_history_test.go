package filter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// TestPerRouteHistoryOverride: a route's override of prefill_history_weight reaches the
// cost through the route's gRPC metadata. w0 computed 4,000 prompt tokens (1,000
// blocks of 4) that have finished; w1 runs one request of 10 blocks. A cold prompt goes
// to w0 on the plain route, where only the present load counts; on the /even route ω =
// 0.1 charges w0's recent prefill, over 100 blocks, and it goes to w1 (though w0 now
// holds the first blocks of the chat template the two prompts share).
func TestPerRouteHistoryOverride(t *testing.T) {
	p := planeWithPolicyRoute(t, "/even/", `{"prefill_history_weight": 0.1}`)
	computed := p.bookings.Book("w0", []uint64{1, 2, 3}, 4000)
	computed.Release()
	running := p.book(t, "w1", 1, 10)
	requireColdPromptsGo(t, p, []pathAndWorker{{"/v1/chat/completions", "w0"}, {"/even/v1/chat/completions", "w1"}})
	running()
	p.requireIdle(t)
}

// planeWithPolicyRoute is a plane whose route under prefix carries policy as its
// per-route override (gRPC initial metadata), beside the plain route.
func planeWithPolicyRoute(t *testing.T, prefix, policy string) *plane {
	t.Helper()
	return newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
		c.Routes = []envoytest.Route{{PathPrefix: prefix, GRPCInitialMetadata: map[string]string{filter.PolicyMetadataKey: policy}}}
	}, filterCfg: func(c *filter.Config) {
		c.ChatPaths = []string{"/v1/chat/completions", prefix + "v1/chat/completions"}
	}})
}

// pathAndWorker is a path to post to and the worker that must serve the request.
type pathAndWorker struct{ path, worker string }

// requireColdPromptsGo posts a cold prompt (a new one each) to each path in turn (the
// order matters: each one's blocks are recorded) and checks the worker that served it.
func requireColdPromptsGo(t *testing.T, p *plane, want []pathAndWorker) {
	t.Helper()
	for i, w := range want {
		t.Run(w.path, func(t *testing.T) {
			resp, _ := p.post(t, w.path, chat(fmt.Sprintf("cold prompt %d ", i)+strings.Repeat("never seen before ", 30), false))
			assert.Equal(t, w.worker, resp.Header.Get("x-served-by"))
		})
	}
}
