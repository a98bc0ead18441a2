package filter_test

import (
	"net/http"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/rewrite"
)

// A data plane that skips the response headers (response_header_mode SKIP, which
// kvroute's checklist does not ask for) sends a rewritten request's response body
// without the headers that say whether it can be renamed: it reaches the client as the
// engine sent it, and the booking is released.
func TestModelRewriteWithoutResponseHeadersPassesTheBody(t *testing.T) {
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			table := rewrite.NewTable(rewrite.Config{
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
			}, &draws{}, nil)
			p := newPlane(t, planeOptions{
				workers: 1, models: [][]string{{"small-v1"}},
				reqMode: extprocfilterv3.ProcessingMode_BUFFERED, respMode: mode, rewrites: table,
				envoyCfg: func(c *envoytest.Config) {
					c.ProcessingMode.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				},
			})
			resp, got := p.post(t, "/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
			require.Equal(t, http.StatusOK, resp.StatusCode, got)
			assert.Contains(t, got, `"model":"small-v1"`, "nothing says the body is JSON: left as it came")
			p.requireIdle(t)
		})
	}
}
