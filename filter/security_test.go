package filter_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// TestClientSentDestinationNeverRoutesOutsideTheFleet: whatever destination header a
// client sends (the configured name in any case, repeated, a list, beside the GIE subset
// hint), in every body mode Envoy may run, including a mode kvroute was not told about,
// the request reaches a configured worker or no upstream at all, never the client's.
func TestClientSentDestinationNeverRoutesOutsideTheFleet(t *testing.T) {
	attacker := newWorker(t, "attacker")
	planes := []struct {
		name       string
		o          planeOptions
		subsetHint bool
	}{
		{name: "BUFFERED", o: planeOptions{reqMode: buffered, respMode: streamed}},
		{name: "FULL_DUPLEX_STREAMED", o: planeOptions{reqMode: fullDuplex, respMode: fullDuplex}},
		{name: "STREAMED, announced", o: planeOptions{reqMode: streamed, respMode: streamed,
			filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }}},
		{name: "NONE, announced", o: planeOptions{reqMode: noBody, respMode: streamed,
			filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }}},
		{name: "STREAMED, kvroute told BUFFERED (Envoy < 1.34)", o: planeOptions{reqMode: streamed, respMode: streamed, noProtocol: true,
			filterCfg: func(c *filter.Config) {
				c.RequestBodyMode = filter.ModeBuffered
				c.ResponseBodyMode = filter.ModeStreamed
			}}},
		{name: "configured name in mixed case", o: planeOptions{reqMode: buffered, respMode: streamed,
			filterCfg: func(c *filter.Config) { c.DestinationHeader = "X-Gateway-Destination-Endpoint" }}},
		{name: "beside the GIE subset hint", subsetHint: true, o: planeOptions{reqMode: fullDuplex, respMode: fullDuplex,
			envoyCfg: func(c *envoytest.Config) { c.ForwardingNamespaces = []string{"envoy.lb.subset_hint"} }}},
	}
	name := "x-gateway-destination-endpoint"
	headerSets := []struct {
		name   string
		header http.Header
	}{
		{"lower case", http.Header{name: {attacker.address()}}},
		{"upper case", http.Header{strings.ToUpper(name): {attacker.address()}}},
		{"canonical case", http.Header{http.CanonicalHeaderKey(name): {attacker.address()}}},
		{"repeated", http.Header{name: {attacker.address(), attacker.address()}}},
		{"a list with the attacker first", http.Header{name: {attacker.address() + ",127.0.0.1:1"}}},
		{"padded", http.Header{name: {" " + attacker.address() + " "}}},
		{"a metadata endpoint", http.Header{name: {"169.254.169.254:80"}}},
	}
	requests := []struct {
		name, method, path, body string
	}{
		{"chat", http.MethodPost, "/v1/chat/completions", chat("route me", false)},
		{"streamed chat", http.MethodPost, "/v1/chat/completions", chat("route me", true)},
		{"completions", http.MethodPost, "/v1/completions", `{"model":"m","prompt":"x"}`},
		{"another path", http.MethodGet, "/v1/models", ""},
		{"a body kvroute rejects", http.MethodPost, "/v1/chat/completions", `{"model":`},
	}
	for _, pc := range planes {
		t.Run(pc.name, func(t *testing.T) {
			p := newPlane(t, pc.o)
			fleet := map[string]bool{}
			for _, w := range p.workers {
				fleet[w.address()] = true
			}
			if pc.subsetHint {
				p.envoy.Config.Routes = []envoytest.Route{{PathPrefix: "/", DynamicMetadata: map[string]map[string]any{
					"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": []any{p.workers[1].address(), attacker.address()}},
				}}}
			}
			client := p.envoy.Client()
			statuses := map[int]int{}
			for _, hs := range headerSets {
				for _, r := range requests {
					req, err := http.NewRequest(r.method, p.envoy.URL+r.path, strings.NewReader(r.body))
					require.NoError(t, err)
					for k, vs := range hs.header {
						req.Header[k] = vs // as written, not canonicalised
					}
					resp, err := client.Do(req)
					require.NoError(t, err)
					resp.Body.Close()
					statuses[resp.StatusCode]++
					assert.NotEqual(t, "attacker", resp.Header.Get("x-served-by"), "%s, %s", hs.name, r.name)
				}
			}
			for _, ex := range p.envoy.Exchanges() {
				assert.True(t, ex.Upstream == "" || fleet[ex.Upstream], "%s went to %q", ex.Path, ex.Upstream)
				if pc.subsetHint && ex.Upstream != "" {
					assert.Equal(t, p.workers[1].address(), ex.Upstream, "the hint's only configured worker")
				}
			}
			assert.Zero(t, attacker.count(), "the attacker's upstream served nothing")
			t.Logf("statuses: %v", statuses)
			if !strings.Contains(pc.name, "kvroute told") {
				valid := len(requests) - 1
				if pc.o.reqMode == streamed || pc.o.reqMode == noBody {
					valid = len(requests) // kvroute does not read the body: routed by load
				}
				assert.Equal(t, len(headerSets)*valid, statuses[http.StatusOK], "every request kvroute accepts is routed")
			}
			p.waitIdle(t)
		})
	}
}
