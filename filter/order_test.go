package filter_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
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

// TestABufferedBodyFollowedByTrailersIsRouted: in BUFFERED mode a request with
// trailers (HTTP/2, or chunked HTTP/1.1 with a trailer section) reaches kvroute as the
// whole body without end_of_stream, then its trailers (ext_proc.cc, Filter::onTrailers,
// and ProcessorState::handleHeadersResponse: end_of_stream is !trailers_available).
// That body is complete and is routed. BUFFERED_PARTIAL sends a body without
// end_of_stream in that case too, and also when the body filled Envoy's buffer: only a
// body cut inside its JSON document is over the buffer (413); a malformed one is the
// client's (400).
func TestABufferedBodyFollowedByTrailersIsRouted(t *testing.T) {
	whole := chat("with trailers", false)
	tests := []struct {
		name string
		mode extprocfilterv3.ProcessingMode_BodySendMode
		body string
		want int // 0: routed
	}{
		{"BUFFERED", buffered, whole, 0},
		{"BUFFERED_PARTIAL, the whole body", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, whole, 0},
		{"BUFFERED_PARTIAL, a body cut at the buffer", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, whole[:len(whole)/2], http.StatusRequestEntityTooLarge},
		{"BUFFERED_PARTIAL, a malformed body", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, `{"model":x}`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{})
			exchange := p.rawStream(t)
			headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "x-gateway-destination-endpoint", RawValue: []byte("10.9.9.9:80")},
			}}
			exchange(&extprocv3.ProcessingRequest{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: tt.mode, ResponseBodyMode: streamed},
				Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}})
			reply := exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(tt.body), EndOfStream: false}}})
			if tt.want != 0 {
				require.NotNil(t, reply.GetImmediateResponse(), "%v", reply)
				assert.EqualValues(t, tt.want, reply.GetImmediateResponse().GetStatus().GetCode())
				p.requireIdle(t)
				return
			}
			require.Nil(t, reply.GetImmediateResponse(), "a complete body is not refused: %s", reply.GetImmediateResponse().GetBody())
			var destination string
			for _, h := range reply.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
					destination = string(h.GetHeader().GetRawValue())
				}
			}
			assert.Contains(t, []string{p.workers[0].address(), p.workers[1].address()}, destination, "routed by the body reply")
			assert.False(t, p.idle(), "booked")
			reply = exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
				RequestTrailers: &extprocv3.HttpTrailers{}}})
			assert.NotNil(t, reply.GetRequestTrailers(), "the trailers are answered as trailers: %v", reply)
			exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}})
			p.requireIdle(t)
			assert.Equal(t, 1.0, completions(t, p, "success"))
		})
	}
}
