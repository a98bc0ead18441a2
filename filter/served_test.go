package filter_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/filter"
)

// With fallback endpoints the data plane may serve a request from a fallback, and says
// which endpoint served it in envoy.lb / x-gateway-destination-endpoint-served on the
// response (docs/proposals/004-endpoint-picker-protocol, Destination Endpoint Served).
// The response's status is then that endpoint's, not the chosen worker's: kvroute
// passed it to the chosen worker's health, so a fallback's 200 cleared the failures of
// a primary that could not be reached, and a fallback's 503 counted against it.
func TestTheServedEndpointDecidesWhoseStatusTheResponseIs(t *testing.T) {
	for _, served := range []string{"fallback", "primary", "unreported"} {
		t.Run(served, func(t *testing.T) {
			health := &statuses{}
			p := newPlane(t, planeOptions{workers: 2, health: health, filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 1 }})
			exchange := p.rawStream(t)
			headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			}}
			exchange(&extprocv3.ProcessingRequest{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: streamed},
				Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}})
			reply := exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(chat("served", false)), EndOfStream: true}}})
			list := reply.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			require.Len(t, p.workers, 2)
			primary, fallback := p.workers[0], p.workers[1]
			if list != primary.address()+","+fallback.address() {
				primary, fallback = fallback, primary
			}
			require.Equal(t, primary.address()+","+fallback.address(), list)

			resp := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("503")}}}, EndOfStream: true}}}
			addr := map[string]string{"fallback": fallback.address(), "primary": primary.address()}[served]
			if addr != "" {
				md, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-served": addr})
				require.NoError(t, err)
				resp.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": md}}
			}
			exchange(resp)
			p.requireIdle(t)
			if served == "fallback" {
				assert.Empty(t, health.of(primary.name), "the fallback's 503 is not the primary's")
				return
			}
			assert.Equal(t, []int{503}, health.of(primary.name))
		})
	}
}
