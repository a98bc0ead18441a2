package envoytest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// passOn starts a processor that names dest as the destination (none if empty) and
// passes everything else on; with fullDuplex, it returns the response body as it came.
// What it received is its exchange's Sent.
func passOn(t *testing.T, dest string, fullDuplex bool) string {
	return startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil && dest != "" {
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", dest, true))}, nil
		}
		if b := req.GetResponseBody(); b != nil && fullDuplex {
			return []*extprocv3.ProcessingResponse{streamedReply(false, b.GetBody(), b.GetEndOfStream())}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
}

// responseHeaders are the response_headers messages of the plane's only exchange.
func responseHeaders(t *testing.T, s *Server) []*extprocv3.HttpHeaders {
	t.Helper()
	ex := s.Exchanges()
	require.Len(t, ex, 1)
	var out []*extprocv3.HttpHeaders
	for _, m := range ex[0].Sent {
		if h := m.GetResponseHeaders(); h != nil {
			out = append(out, h)
		}
	}
	return out
}

// responseBody is the response body the processor was sent in the plane's only
// exchange, and whether its last message ended the stream.
func responseBody(t *testing.T, s *Server) (string, bool) {
	t.Helper()
	ex := s.Exchanges()
	require.Len(t, ex, 1)
	var b strings.Builder
	eos := false
	for _, m := range ex[0].Sent {
		if rb := m.GetResponseBody(); rb != nil {
			b.Write(rb.GetBody())
			eos = rb.GetEndOfStream()
		}
	}
	return b.String(), eos
}

func headerOf(h *extprocv3.HttpHeaders, name string) string {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == name {
			return string(hv.GetRawValue()) + hv.GetValue()
		}
	}
	return ""
}

// TestRouterLocalRepliesGoThroughTheProcessor pins the router's local replies as Envoy
// sends them while the response has not started: through the encoder filter chain
// (filter_manager.cc, sendLocalReplyViaFilterChain), so the ext_proc filter sends the
// processor response_headers with the reply's :status, content-type and content-length
// (ext_proc.cc, encodeHeaders), then the body per the response body mode; the client
// gets the reply. The 503s and 504 are router.cc's onUpstreamReset,
// sendNoHealthyUpstreamResponse and onResponseTimeout.
func TestRouterLocalRepliesGoThroughTheProcessor(t *testing.T) {
	slow := httptestSlow(t, 2*time.Second)
	tests := []struct {
		name     string
		dest     string
		timeout  time.Duration
		status   int
		bodyPart string
	}{
		{"connection refused", refusedAddress(t), 0, 503, "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"},
		{"no host", "", 0, 503, "no healthy upstream"},
		{"route timeout", slow, 100 * time.Millisecond, 504, "upstream request timeout"},
	}
	for _, tt := range tests {
		for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{none, buffered, streamed, fullDuplex} {
			t.Run(tt.name+"/"+mode.String(), func(t *testing.T) {
				pm := &extprocfilterv3.ProcessingMode{ResponseBodyMode: mode}
				if mode == fullDuplex {
					pm.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
				}
				s := newPlane(t, Config{ProcessorAddress: passOn(t, tt.dest, mode == fullDuplex), ProcessingMode: pm,
					Routes: []Route{{PathPrefix: "/", Timeout: tt.timeout}}})
				code, body := do(t, s, "")
				assert.Equal(t, tt.status, code)
				assert.Contains(t, body, tt.bodyPart)
				ex := s.Exchanges()[0]
				assert.True(t, ex.LocalReply)
				assert.Equal(t, tt.status, ex.Status)
				rh := responseHeaders(t, s)
				require.Len(t, rh, 1, "the local reply goes to the processor as a response")
				assert.Equal(t, strconv.Itoa(tt.status), headerOf(rh[0], ":status"))
				assert.Equal(t, "text/plain", headerOf(rh[0], "content-type"))
				assert.Equal(t, strconv.Itoa(len(body)), headerOf(rh[0], "content-length"), "the processor sees content-length")
				assert.False(t, rh[0].GetEndOfStream(), "the reply has a body")
				got, eos := responseBody(t, s)
				if mode == none {
					assert.Empty(t, got, "body mode NONE: no body message")
				} else {
					assert.Equal(t, body, got, "the body goes to the processor in the body mode")
					assert.True(t, eos)
				}
			})
		}
	}
}

// TestLocalReplyIsAResponseWhoseRepliesApply pins that the processor's reply to a local
// reply's headers applies as to any response's (a header mutation), and that an
// immediate response to it replaces the local reply.
func TestLocalReplyIsAResponseWhoseRepliesApply(t *testing.T) {
	dest := refusedAddress(t)
	t.Run("header mutation", func(t *testing.T) {
		addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			switch {
			case req.GetRequestHeaders() != nil:
				return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", dest, true))}, nil
			case req.GetResponseHeaders() != nil:
				return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-seen", "yes", true)}}}}}}}, nil
			}
			return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
		})
		s := newPlane(t, Config{ProcessorAddress: addr})
		resp, err := s.Client().Get(s.URL + "/v1/test")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 503, resp.StatusCode)
		assert.Equal(t, "yes", resp.Header.Get("x-seen"))
	})
	t.Run("immediate response", func(t *testing.T) {
		addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			switch {
			case req.GetRequestHeaders() != nil:
				return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", dest, true))}, nil
			case req.GetResponseHeaders() != nil:
				return []*extprocv3.ProcessingResponse{immediateReply(typev3.StatusCode_TooManyRequests, "busy")}, nil
			}
			return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
		})
		s := newPlane(t, Config{ProcessorAddress: addr})
		code, body := do(t, s, "")
		assert.Equal(t, 429, code)
		assert.Equal(t, "busy", body)
	})
}

// TestSkipLocalRepliesKeepsThemFromTheProcessor pins Envoy 1.34 to 1.36
// (skip_ext_proc_on_local_reply, ext_proc.h Filter::onLocalReply): the processor sees no
// response at all, and the client still gets the router's reply.
func TestSkipLocalRepliesKeepsThemFromTheProcessor(t *testing.T) {
	s := newPlane(t, Config{ProcessorAddress: passOn(t, refusedAddress(t), false), SkipLocalReplies: true})
	code, body := do(t, s, "")
	assert.Equal(t, 503, code)
	assert.Contains(t, body, "upstream connect error")
	assert.Empty(t, responseHeaders(t, s))
}

// TestPayloadTooLargeGoesThroughTheProcessor pins filter_manager.cc,
// requestDataTooLarge: the 413 is a local reply sent through the filter chain, so the
// processor, which has seen the request headers, gets it as response_headers.
func TestPayloadTooLargeGoesThroughTheProcessor(t *testing.T) {
	s := newPlane(t, Config{ProcessorAddress: passOn(t, "", false), BufferLimit: 10, ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered}})
	code, _ := do(t, s, strings.Repeat("x", 11))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	rh := responseHeaders(t, s)
	require.Len(t, rh, 1)
	assert.Equal(t, "413", headerOf(rh[0], ":status"))
}

// TestHeadLocalReplyHasNoBody pins http/utility.cc, prepareLocalReply: a HEAD request's
// local reply ends at its headers.
func TestHeadLocalReplyHasNoBody(t *testing.T) {
	s := newPlane(t, Config{ProcessorAddress: passOn(t, refusedAddress(t), false), ProcessingMode: &extprocfilterv3.ProcessingMode{ResponseBodyMode: buffered}})
	resp, err := s.Client().Head(s.URL + "/v1/test")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode)
	rh := responseHeaders(t, s)
	require.Len(t, rh, 1)
	assert.True(t, rh[0].GetEndOfStream())
	got, _ := responseBody(t, s)
	assert.Empty(t, got)
}

// TestRouteTimeoutAfterHeadersResets pins router.cc, onResponseTimeout once the
// response started: the local reply can only reset the stream.
func TestRouteTimeoutAfterHeadersResets(t *testing.T) {
	up := httptestHeadersThenStall(t)
	s := newPlane(t, Config{ProcessorAddress: passOn(t, up, false), Routes: []Route{{PathPrefix: "/", Timeout: 100 * time.Millisecond}}})
	resp, err := s.Client().Get(s.URL + "/v1/test")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	assert.Error(t, err, "the stream is reset")
	assert.Len(t, responseHeaders(t, s), 1, "only the upstream's headers")
}

// httptestSlow is an upstream that answers only after d (or when the request ends).
func httptestSlow(t *testing.T, d time.Duration) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// httptestHeadersThenStall is an upstream that sends its headers and a first chunk, then
// stalls until the request ends.
func httptestHeadersThenStall(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
