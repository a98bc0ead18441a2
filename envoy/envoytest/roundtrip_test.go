package envoytest

import (
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOnRoundTripTimesEachMessageUntilItsReply pins the timing hook: one call per
// message that waits for a reply, in order, each at least as long as the processor took
// to answer it.
func TestOnRoundTripTimesEachMessageUntilItsReply(t *testing.T) {
	const bodyDelay = 30 * time.Millisecond
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			time.Sleep(bodyDelay) // the "decision", answered with the body as kvroute does
			reply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: headersReply(true, set("x-gateway-destination-endpoint", up, true)).GetRequestHeaders().GetResponse()}}}
			return []*extprocv3.ProcessingResponse{reply}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	var mu sync.Mutex
	var seen []RoundTrip
	s := newPlane(t, Config{ProcessorAddress: addr, MessageTimeout: time.Minute,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered, ResponseBodyMode: streamed},
		OnRoundTrip: func(rt RoundTrip) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, rt)
		},
	})
	code, _ := do(t, s, "abc")
	require.Equal(t, 200, code)
	s.Exchanges() // waits for the request to finish

	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, rt := range seen {
		kinds = append(kinds, rt.Message)
		assert.Positive(t, rt.Took)
	}
	// The response streams at least one chunk and the empty end-of-stream chunk.
	require.GreaterOrEqual(t, len(kinds), 4)
	assert.Equal(t, []string{MessageRequestHeaders, MessageRequestBody, MessageResponseHeaders}, kinds[:3])
	for _, k := range kinds[3:] {
		assert.Equal(t, MessageResponseBody, k)
	}
	assert.GreaterOrEqual(t, seen[1].Took, bodyDelay, "the body round trip includes the processor's time")
}

func TestDiscardExchangesKeepsNone(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, DiscardExchanges: true})
	code, body := do(t, s, "")
	require.Equal(t, 200, code, body)
	assert.Empty(t, s.Exchanges())
}
