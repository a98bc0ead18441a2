package filter_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// TestBodyModesKvrouteCannotReadAreRoutedByLoad: with request bodies NONE or STREAMED,
// Envoy needs the headers reply before kvroute could read the body, so the request is
// routed by load at its headers (to the less loaded worker, as load_only) and the body,
// however many chunks, reaches the worker untouched.
func TestBodyModesKvrouteCannotReadAreRoutedByLoad(t *testing.T) {
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, strings.Repeat("a long document line. ", 5000)) // ~110 KB: four STREAMED chunks
	for _, m := range []struct {
		name      string
		req, resp extprocfilterv3.ProcessingMode_BodySendMode
	}{{"NONE", noBody, streamed}, {"STREAMED", streamed, streamed}, {"STREAMED, response NONE", streamed, noBody}} {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp,
				// The config's mode is only for Envoys that do not announce theirs.
				filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }})
			release := p.book(t, "w0", 0, 10)
			resp, out := p.post(t, "/v1/chat/completions", body)
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			assert.Equal(t, "w1", resp.Header.Get("x-served-by"), "the less loaded worker")
			served := p.workers[1].Served()
			require.Len(t, served, 1)
			assert.Equal(t, body, string(served[0].Body), "the body passed through untouched")
			release()

			ex := p.envoy.Exchanges()[0]
			assert.Empty(t, ex.IgnoredMutations, "the destination rode on the headers reply")
			assert.True(t, ex.RouteCacheCleared)
			chunks := 0
			for _, msg := range ex.Sent {
				if msg.GetRequestBody() != nil {
					chunks++
				}
			}
			if m.req == streamed {
				assert.GreaterOrEqual(t, chunks, 4, "STREAMED sent the body in chunks, each answered")
			} else {
				assert.Zero(t, chunks, "NONE sends no body")
			}
			assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
			assert.Zero(t, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
			p.waitIdle(t)
			assert.Equal(t, 1.0, completions(t, p, "success"))
		})
	}
}

// TestPolicyFromTheKvrouteMetadataNamespace: a policy in the `kvroute` dynamic-metadata
// namespace, forwarded by Envoy (forwarding_namespaces), applies to that request like a
// route's grpc_initial_metadata override; an invalid one is a 500 naming the key; a
// namespace Envoy does not forward changes nothing.
func TestPolicyFromTheKvrouteMetadataNamespace(t *testing.T) {
	sticky := func(policy map[string]any) []envoytest.Route {
		return []envoytest.Route{{PathPrefix: "/sticky/", DynamicMetadata: map[string]map[string]any{
			filter.MetadataNamespace: {"policy": policy},
		}}}
	}
	tests := []struct {
		name       string
		forwarded  bool
		policy     map[string]any
		wantKept   bool
		wantStatus int
		wantError  string
	}{
		{name: "forwarded: the session stays", forwarded: true, policy: map[string]any{"prefix_affinity_weight": 4}, wantKept: true, wantStatus: 200},
		{name: "not forwarded: the default cost moves it", policy: map[string]any{"prefix_affinity_weight": 4}, wantStatus: 200},
		{name: "an invalid value", forwarded: true, policy: map[string]any{"prefix_affinity_weight": -1}, wantStatus: 500, wantError: "policy.prefix_affinity_weight"},
		{name: "an unknown key", forwarded: true, policy: map[string]any{"affinity": 4}, wantStatus: 500, wantError: "affinity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
				c.Routes = sticky(tt.policy)
				if tt.forwarded {
					c.ForwardingNamespaces = []string{filter.MetadataNamespace}
				}
			}, filterCfg: func(c *filter.Config) {
				c.ChatPaths = []string{"/v1/chat/completions", "/sticky/v1/chat/completions"}
			}})
			prompt, holder, release := busyHolder(t, p)
			resp, body := p.post(t, "/sticky/v1/chat/completions", chat(prompt+" more", false))
			release()
			require.Equal(t, tt.wantStatus, resp.StatusCode, body)
			if tt.wantError != "" {
				assert.Contains(t, body, tt.wantError)
			} else {
				assert.Equal(t, tt.wantKept, resp.Header.Get("x-served-by") == holder)
			}
			p.requireIdle(t)
		})
	}
}

// TestLoadOnlyRoutingHonoursTheModelHeader: a request routed without its body is
// restricted to the workers serving the model the model header names (GIE's body-based
// router sets it); a model nobody serves is a 404; without the header, or with the key
// set to "", every worker is a candidate.
func TestLoadOnlyRoutingHonoursTheModelHeader(t *testing.T) {
	tests := []struct {
		name        string
		modelHeader string // the config's model_header
		sent        []string
		want        string // x-served-by, or the error code
	}{
		{"the header names a model only the busy worker serves", "x-gateway-model-name", []string{"x-gateway-model-name", "b"}, "w1"},
		{"a configured name in another case", "X-Gateway-Model-Name", []string{"x-gateway-model-name", "b"}, "w1"},
		{"a model nobody serves", "x-gateway-model-name", []string{"x-gateway-model-name", "c"}, "model_not_found"},
		{"no header: every worker is a candidate", "x-gateway-model-name", nil, "w0"},
		{"model_header off: the header is not read", "", []string{"x-gateway-model-name", "b"}, "w0"},
	}
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{noBody, streamed} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%v/%s", mode, tt.name), func(t *testing.T) {
				p := newPlane(t, planeOptions{reqMode: mode, respMode: streamed, models: [][]string{{"a"}, {"b"}},
					filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered; c.ModelHeader = tt.modelHeader }})
				release := p.book(t, "w1", 0, 10) // w1 is the busier worker
				defer release()
				for _, path := range []string{"/v1/chat/completions", "/v1/embeddings"} {
					resp, body := p.post(t, path, `{"model":"a","input":"x","messages":[{"role":"user","content":"x"}]}`, tt.sent...)
					if tt.want == "model_not_found" {
						assert.Equal(t, http.StatusNotFound, resp.StatusCode, body)
						assert.Contains(t, body, `"code":"model_not_found"`)
						continue
					}
					require.Equal(t, http.StatusOK, resp.StatusCode, body)
					assert.Equal(t, tt.want, resp.Header.Get("x-served-by"), path)
				}
			})
		}
	}
}
