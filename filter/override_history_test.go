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
	p := newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
		c.Routes = []envoytest.Route{{PathPrefix: "/even/", GRPCInitialMetadata: map[string]string{
			filter.PolicyMetadataKey: `{"prefill_history_weight": 0.1}`,
		}}}
	}, filterCfg: func(c *filter.Config) {
		c.ChatPaths = []string{"/v1/chat/completions", "/even/v1/chat/completions"}
	}})
	computed := p.bookings.Book("w0", []uint64{1, 2, 3}, 4000)
	computed.Release()
	running := p.book(t, "w1", 1, 10)

	tests := []struct {
		path string
		want string
	}{
		{"/v1/chat/completions", "w0"},
		{"/even/v1/chat/completions", "w1"},
	}
	for i, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, _ := p.post(t, tt.path, chat(fmt.Sprintf("cold prompt %d ", i)+strings.Repeat("never seen before ", 30), false))
			assert.Equal(t, tt.want, resp.Header.Get("x-served-by"))
		})
	}
	running()
	p.requireIdle(t)
}
