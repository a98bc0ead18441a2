package filter_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResponseHeadersTwiceObserveHealthOnce: a response_headers message that comes
// twice (Envoy out of order) reported one response's status to the health tracker
// twice: one 5xx counted as two failures in a row toward unhealthy_threshold.
func TestResponseHeadersTwiceObserveHealthOnce(t *testing.T) {
	health := &statuses{}
	p := newPlane(t, planeOptions{workers: 1, health: health})
	exchange, list := routedStream(t, p, "twice")
	require.Equal(t, []string{p.workers[0].address()}, list)
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("503")}}}}}}
	exchange(headers)
	exchange(headers)
	assert.Equal(t, []int{503}, health.of(p.workers[0].name), "one response, one status")
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
	p.requireIdle(t)
}

// TestUsageOfAResponseEndingWithTrailersIsCounted: a response that ends with trailers
// (FULL_DUPLEX_STREAMED, trailers SEND as the mode requires: the last body chunk then
// has no end_of_stream) was released at the trailers without its usage being read.
func TestUsageOfAResponseEndingWithTrailersIsCounted(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 1, reqMode: buffered, respMode: fullDuplex})
	exchange := p.rawStream(t)
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	exchange(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: fullDuplex},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}})
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(chat("trailers", false)), EndOfStream: true}}})
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}})
	body := `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":1}}`
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body)}}})
	reply := exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	require.NotNil(t, reply.GetResponseTrailers())
	p.requireIdle(t)
	assert.Equal(t, 1.0, completions(t, p, "success"))
	assert.Equal(t, 42.0, p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil), "the usage is read at the trailers too")
}
