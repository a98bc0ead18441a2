package filter_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

const (
	prefillHeader = "x-prefiller-host-port"
	// clientPrefiller is a client's own prefill worker, outside the fleet: the routing
	// sidecar would send it the prompt.
	clientPrefiller = "169.254.169.254:80"
)

// prefillEdit is what one request headers or body reply did to the prefill header.
type prefillEdit struct {
	reply   string // "headers" or "body"
	removed bool
	set     *corev3.HeaderValueOption // nil: not set
}

// prefillEdits lists, in order, the replies of ex that carry a header mutation and what
// each did to the prefill header.
func prefillEdits(ex *envoytest.Exchange) []prefillEdit {
	var out []prefillEdit
	for _, r := range ex.Received {
		var e prefillEdit
		var m *extprocv3.HeaderMutation
		switch x := r.GetResponse().(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			e.reply, m = "headers", x.RequestHeaders.GetResponse().GetHeaderMutation()
		case *extprocv3.ProcessingResponse_RequestBody:
			e.reply, m = "body", x.RequestBody.GetResponse().GetHeaderMutation()
		}
		if m == nil {
			continue
		}
		for _, h := range m.GetRemoveHeaders() {
			e.removed = e.removed || h == prefillHeader
		}
		for _, o := range m.GetSetHeaders() {
			if o.GetHeader().GetKey() == prefillHeader {
				e.set = o
			}
		}
		out = append(out, e)
	}
	return out
}

// disaggregate splits every request whose destination misses at least tokens of it.
func disaggregate(tokens float64) scoring.Params {
	p := scoring.DynamoParams()
	p.DisaggregateTokens = tokens
	return p
}

// TestPrefillHeaderNamesThePrefillWorkerOfASplitRequest: in the body modes kvroute
// reads, a split request's routing reply sets prefill_header to the prefill worker's
// address with OVERWRITE_IF_EXISTS_OR_ADD, so the destination gets kvroute's prefill
// worker and never the client's; in BUFFERED the early headers reply has already
// removed the client's value. The prefill worker itself is not sent the request.
func TestPrefillHeaderNamesThePrefillWorkerOfASplitRequest(t *testing.T) {
	for _, m := range modes[:2] {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp, roles: []string{router.RoleDecode, router.RolePrefill}})
			resp, body := p.post(t, "/v1/chat/completions", chat("split me", false), prefillHeader, clientPrefiller)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			assert.Equal(t, "w0", resp.Header.Get("x-served-by"), "the only destination")
			served := p.workers[0].Served()
			require.Len(t, served, 1)
			assert.Equal(t, []string{p.workers[1].address()}, served[0].Header.Values(prefillHeader), "kvroute's prefill worker, once")
			assert.Zero(t, p.workers[1].count(), "the decode worker's sidecar, not Envoy, asks the prefill worker")

			edits := prefillEdits(p.envoy.Exchanges()[0])
			require.NotEmpty(t, edits)
			routing := edits[len(edits)-1]
			require.NotNil(t, routing.set, "the routing reply sets the header")
			assert.Equal(t, p.workers[1].address(), string(routing.set.GetHeader().GetRawValue()))
			assert.Equal(t, corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD, routing.set.GetAppendAction())
			assert.False(t, routing.removed)
			if m.req == buffered {
				require.Len(t, edits, 2)
				assert.Equal(t, prefillEdit{reply: "headers", removed: true}, edits[0], "the early headers reply strips the client's")
			}
			assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_disaggregation_total", map[string]string{"outcome": "prefill", "prefill_worker": "w1"}))
			p.requireIdle(t)
		})
	}
}

// TestPrefillHeaderIsRemovedFromRequestsNotSplit: every reply that forwards a request
// kvroute does not split removes prefill_header, so a client's value never reaches the
// decode worker's sidecar: under disaggregate_tokens, in a fleet without prefill
// workers, and routed by load (a path kvroute does not read, a body mode it cannot).
func TestPrefillHeaderIsRemovedFromRequestsNotSplit(t *testing.T) {
	pd := []string{router.RoleDecode, router.RolePrefill}
	tests := []struct {
		name      string
		req, resp extprocfilterv3.ProcessingMode_BodySendMode
		roles     []string
		params    scoring.Params
		path      string
		outcome   string // kvroute_filter_disaggregation_total's; "": not counted
	}{
		{"BUFFERED, under disaggregate_tokens", buffered, streamed, pd, disaggregate(1e6), "/v1/chat/completions", router.DecodeOnlyUnderThreshold},
		{"FULL_DUPLEX_STREAMED, under disaggregate_tokens", fullDuplex, fullDuplex, pd, disaggregate(1e6), "/v1/chat/completions", router.DecodeOnlyUnderThreshold},
		{"BUFFERED, no prefill workers", buffered, streamed, nil, disaggregate(0), "/v1/chat/completions", ""},
		{"FULL_DUPLEX_STREAMED, no prefill workers", fullDuplex, fullDuplex, nil, disaggregate(0), "/v1/chat/completions", ""},
		{"load only: a path kvroute does not read", buffered, streamed, pd, disaggregate(0), "/v1/embeddings", ""},
		{"load only: a STREAMED request body", streamed, streamed, pd, disaggregate(0), "/v1/chat/completions", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: tt.req, respMode: tt.resp, roles: tt.roles, params: tt.params,
				// The config's mode is only for Envoys that do not announce theirs.
				filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }})
			resp, body := p.post(t, tt.path, chat("do not split me", false), prefillHeader, clientPrefiller)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			served := p.servedRequests()
			require.Len(t, served, 1)
			assert.NotContains(t, served[0].Header, http.CanonicalHeaderKey(prefillHeader), "the client's value is removed")

			edits := prefillEdits(p.envoy.Exchanges()[0])
			require.NotEmpty(t, edits)
			for _, e := range edits {
				assert.Nil(t, e.set, "%s reply", e.reply)
			}
			assert.True(t, edits[len(edits)-1].removed, "the routing reply removes it")
			if tt.req == buffered && tt.path == "/v1/chat/completions" {
				require.Len(t, edits, 2)
				assert.Equal(t, prefillEdit{reply: "headers", removed: true}, edits[0], "and so does the early headers reply")
			}
			want := map[string]float64{}
			if tt.outcome != "" {
				want[tt.outcome] = 1
			}
			for _, outcome := range []string{"prefill", router.DecodeOnlyUnderThreshold, router.DecodeOnlyNoPrefillWorker} {
				assert.Equal(t, want[outcome], p.counter(t, "kvroute_filter_disaggregation_total", map[string]string{"outcome": outcome}), outcome)
			}
			p.requireIdle(t)
		})
	}
}

func TestPrefillHeaderConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name, header string
		wantErr      bool
	}{
		{"the default", "x-prefiller-host-port", false},
		{"another name, in mixed case", "X-My-Prefiller", false},
		{"empty", "", true},
		{"a space", "x prefiller", true},
		{"a colon", "x-prefiller:host", true},
		{"x-envoy, which ext_proc may not set", "x-envoy-prefiller", true},
		{"x-envoy in upper case", "X-Envoy-Prefiller", true},
		{"the destination header", "x-gateway-destination-endpoint", true},
		{"the destination header in another case", "X-Gateway-Destination-Endpoint", true},
		{"the model header", "x-gateway-model-name", true},
		{"host, which Envoy does not let ext_proc change", "Host", true},
		{"the body's framing", "content-length", true},
		{"the client's credentials", "authorization", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := filter.DefaultConfig()
			cfg.PrefillHeader = tt.header
			err := cfg.Validate()
			if !tt.wantErr {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "prefill_header")
		})
	}
}

// A prefill_header configured in mixed case goes to Envoy in lower case, as the other
// header names do, both where it is set and where it is removed.
func TestPrefillHeaderGoesToEnvoyInLowerCase(t *testing.T) {
	for _, tt := range []struct {
		name   string
		params scoring.Params
		split  bool
	}{{"split", disaggregate(0), true}, {"not split", disaggregate(1e6), false}} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: buffered, respMode: streamed, roles: []string{router.RoleDecode, router.RolePrefill},
				params: tt.params, filterCfg: func(c *filter.Config) { c.PrefillHeader = "X-Prefiller-Host-Port" }})
			resp, body := p.post(t, "/v1/chat/completions", chat("split me", false), prefillHeader, clientPrefiller)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			edits := prefillEdits(p.envoy.Exchanges()[0])
			require.Len(t, edits, 2)
			assert.True(t, edits[0].removed, "the early headers reply")
			if tt.split {
				require.NotNil(t, edits[1].set, "the routing reply")
			} else {
				assert.True(t, edits[1].removed, "the routing reply")
			}
			p.requireIdle(t)
		})
	}
}

// llm-d's routing sidecar reads x-prefiller-url when x-prefiller-host-port is absent
// (its older header, kept for backward compatibility): a client's value of it must not
// reach the sidecar either, whether kvroute splits the request, does not, or routes it
// by load.
func TestTheSidecarsLegacyPrefillHeaderIsAlwaysRemoved(t *testing.T) {
	pd := []string{router.RoleDecode, router.RolePrefill}
	tests := []struct {
		name      string
		req, resp extprocfilterv3.ProcessingMode_BodySendMode
		params    scoring.Params
		path      string
	}{
		{"BUFFERED, split", buffered, streamed, disaggregate(0), "/v1/chat/completions"},
		{"BUFFERED, not split", buffered, streamed, disaggregate(1e6), "/v1/chat/completions"},
		{"FULL_DUPLEX_STREAMED, split", fullDuplex, fullDuplex, disaggregate(0), "/v1/chat/completions"},
		{"FULL_DUPLEX_STREAMED, not split", fullDuplex, fullDuplex, disaggregate(1e6), "/v1/chat/completions"},
		{"load only: a STREAMED request body", streamed, streamed, disaggregate(0), "/v1/chat/completions"},
		{"load only: a path kvroute does not read", buffered, streamed, disaggregate(0), "/v1/embeddings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: tt.req, respMode: tt.resp, roles: pd, params: tt.params,
				filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }})
			resp, body := p.post(t, tt.path, chat("split me or not", false), "x-prefiller-url", "http://"+clientPrefiller)
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			served := p.servedRequests()
			require.Len(t, served, 1)
			assert.NotContains(t, served[0].Header, "X-Prefiller-Url", "the client's value is removed")
			p.requireIdle(t)
		})
	}
}

// A split request's prefill worker is free once the destination's response headers
// arrive (the sidecar answers only after the prefill worker did), not at the first body
// byte: a non-streamed response's body comes at the end of generation, and the prefill
// worker would look busy, and be shed at max_active_requests_per_worker, all along.
func TestThePrefillWorkerIsFreedAtTheDestinationsResponseHeaders(t *testing.T) {
	p := newPlane(t, planeOptions{reqMode: buffered, respMode: streamed, roles: []string{router.RoleDecode, router.RolePrefill}, params: disaggregate(0)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.envoy.URL+"/v1/chat/completions", strings.NewReader(chat("HANG_AFTER_HEADERS", false)))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := p.envoy.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return p.bookings.Load("w0").ActiveRequests == 1 }, 5*time.Second, 2*time.Millisecond, "routed")
	require.Eventually(t, func() bool { return p.bookings.Load("w1") == scoring.Load{} }, 5*time.Second, 2*time.Millisecond,
		"the prefill worker's booking ends at the response headers")
	assert.Equal(t, 1, p.bookings.Load("w0").ActiveRequests, "the destination still decodes")
	cancel()
	<-done
	p.waitIdle(t)
}
