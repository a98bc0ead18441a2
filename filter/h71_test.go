package filter_test

// Review proofs (helper h71): each test fails on main at 2f1d507.

import (
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// A decision made for a stream Envoy already gave up on (message_timeout) is booked
// and released, but its blocks stay recorded on the chosen worker: the index says the
// worker holds a prompt no worker ever received.
func TestH71ALateDecisionRecordsNothing(t *testing.T) {
	stall := stallingRouter{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	p := newPlane(t, planeOptions{
		wrapRouter: func(r filter.Router) filter.Router { stall.Router = r; return stall },
		envoyCfg:   func(c *envoytest.Config) { c.MessageTimeout = time.Second },
	})
	statuses := make(chan int, 1)
	go func() {
		resp, err := p.envoy.Client().Post(p.envoy.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(chat(strings.Repeat("a prompt that never reaches a worker ", 20), false)))
		if err != nil {
			statuses <- -1
			return
		}
		resp.Body.Close()
		statuses <- resp.StatusCode
	}()
	<-stall.entered
	require.Equal(t, http.StatusGatewayTimeout, <-statuses)
	stall.gate <- struct{}{}
	require.Eventually(t, func() bool { return completions(t, p, "cancelled") == 1 }, 20*time.Second, 2*time.Millisecond)
	p.requireIdle(t)
	for _, w := range p.workers {
		assert.Zero(t, w.count(), "no worker was sent the request")
		assert.Zero(t, p.index.WorkerEntries(w.name), "%s is credited with blocks it never computed", w.name)
	}
}

// A response_headers message that comes twice (Envoy out of order) reports one
// response's status to the health tracker twice: one 5xx counts as two failures in a
// row toward unhealthy_threshold.
func TestH71ResponseHeadersTwiceObserveHealthOnce(t *testing.T) {
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

// A response that ends with trailers (FULL_DUPLEX_STREAMED, trailers SEND as the mode
// requires: the last body chunk then has no end_of_stream) is released at the
// trailers, but its usage object is never read.
func TestH71UsageOfAResponseEndingWithTrailersIsCounted(t *testing.T) {
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
