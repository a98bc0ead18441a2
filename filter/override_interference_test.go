package filter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// TestPerRouteInterferenceOverride: a route's override of interference_weight reaches
// the cost through the route's gRPC metadata. w0 runs four short requests (40 active
// blocks), w1 one long one (200 blocks). A cold prompt goes to w0 on the plain route,
// where only blocks count; on the /calm route ι = 4 charges its ~40 missing blocks once
// per request running there, 4·4·R on w0 against 4·1·R on w1, and it goes to w1.
func TestPerRouteInterferenceOverride(t *testing.T) {
	p := newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
		c.Routes = []envoytest.Route{{PathPrefix: "/calm/", GRPCInitialMetadata: map[string]string{
			filter.PolicyMetadataKey: `{"interference_weight": 4}`,
		}}}
	}, filterCfg: func(c *filter.Config) {
		c.ChatPaths = []string{"/v1/chat/completions", "/calm/v1/chat/completions"}
	}})
	var busy []func()
	for i := range 4 {
		busy = append(busy, p.book(t, "w0", i, 10))
	}
	busy = append(busy, p.book(t, "w1", 4, 200))

	tests := []struct {
		path string
		want string
	}{
		{"/calm/v1/chat/completions", "w1"},
		{"/v1/chat/completions", "w0"},
	}
	for i, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, _ := p.post(t, tt.path, chat(fmt.Sprintf("cold prompt %d ", i)+strings.Repeat("never seen before ", 30), false))
			assert.Equal(t, tt.want, resp.Header.Get("x-served-by"))
		})
	}
	for _, release := range busy {
		release()
	}
	p.requireIdle(t)
}
