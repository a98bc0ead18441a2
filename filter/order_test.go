package filter_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// TestABodyBeforeTheRequestHeadersIsRefused: with the filter's request_header_mode
// SKIP, Envoy opens the stream with the request body and kvroute never sees the
// headers, so it can neither route the request nor strip the client's destination
// header. kvroute refuses the request with an OpenAI 500 (an immediate response, which
// holds even with failure_mode_allow) rather than pass the body on and let the
// client's header pick the upstream.
func TestABodyBeforeTheRequestHeadersIsRefused(t *testing.T) {
	attacker := newWorker(t, "attacker")
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{buffered, streamed} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: mode, respMode: streamed,
				filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered },
				envoyCfg: func(c *envoytest.Config) {
					c.ProcessingMode.RequestHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				}})
			for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
				resp, body := p.post(t, path, chat("skip the headers", false), "x-gateway-destination-endpoint", attacker.address())
				assert.NotEqual(t, "attacker", resp.Header.Get("x-served-by"), path)
				require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
				var e openAIError
				require.NoError(t, json.Unmarshal([]byte(body), &e), body)
				assert.True(t, strings.Contains(e.Error.Message, "request_header_mode"), e.Error.Message)
			}
			assert.Zero(t, attacker.count(), "the client's upstream served nothing")
			p.requireIdle(t)
		})
	}
}
