package filter_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// responsesStream opens an ext_proc stream as Envoy does for a buffered POST on path
// with body, and returns it with the worker address kvroute chose.
func responsesStream(t *testing.T, p *plane, path, body string) (func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, string) {
	t.Helper()
	exchange := p.rawStream(t)
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)},
	}}
	exchange(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: streamed},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}})
	reply := exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	chosen := reply.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	require.NotEmpty(t, chosen, "routed")
	return exchange, chosen
}

func responseBody(body string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}}
}

// TestAResponseServedByAnUnlistedEndpointIsNotRememberedOnTheChosenWorker: the data
// plane reports that an endpoint kvroute did not list served the request (its own
// fallback); that endpoint's engine stored the response, not the chosen worker's. Learned
// on the chosen worker, every later turn naming the id was pinned to a worker that
// answers 404.
func TestAResponseServedByAnUnlistedEndpointIsNotRememberedOnTheChosenWorker(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, responses: true})
	exchange, _ := responsesStream(t, p, "/v1/responses", `{"model":"m","input":"x"}`)
	exchange(servedResponseHeaders(t, "10.9.9.9:8000"))
	exchange(responseBody(`{"id":"resp_elsewhere","object":"response"}`))
	p.requireIdle(t)

	// No fake worker stored it (the endpoint is outside the fleet): every one answers 404.
	p.post(t, "/v1/responses", `{"model":"m","input":"y","previous_response_id":"resp_elsewhere"}`)
	m := p.storedResponseRequests(t)
	assert.Zero(t, m["stored_worker"], "pinned to a worker that never stored it")
	assert.Equal(t, 1.0, m["unknown"])
}
