package envoytest

import (
	"net"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refusedAddress returns a loopback address nothing listens on: a connection to it is
// refused, as to a worker whose process is gone.
func refusedAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestEveryMessageCarriesTheForwardedMetadata pins what Envoy's ext_proc filter sends:
// every message, headers, body chunks and trailers alike and in every body mode, carries
// the forwarded namespaces in metadata_context (ext_proc.cc: buildHeaderRequest,
// setupBodyChunk and sendTrailers each call addDynamicMetadata), and with
// ServeFromFallbacks the response's messages name the endpoint that served.
func TestEveryMessageCarriesTheForwardedMetadata(t *testing.T) {
	up := echoUpstream(t)
	dead := refusedAddress(t)
	tests := []struct {
		name string
		mode extprocfilterv3.ProcessingMode_BodySendMode
	}{
		{"BUFFERED", buffered},
		{"STREAMED", streamed},
		{"FULL_DUPLEX_STREAMED", fullDuplex},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			duplex := tt.mode == fullDuplex
			destination := set("x-gateway-destination-endpoint", dead+","+up, true)
			var body []byte
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				switch r := req.GetRequest().(type) {
				case *extprocv3.ProcessingRequest_RequestHeaders:
					if duplex {
						return nil, nil // the headers reply waits for the body
					}
					return []*extprocv3.ProcessingResponse{headersReply(true, destination)}, nil
				case *extprocv3.ProcessingRequest_RequestBody:
					if !duplex {
						return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
					}
					body = append(body, r.RequestBody.GetBody()...)
					if !r.RequestBody.GetEndOfStream() {
						return nil, nil
					}
					return []*extprocv3.ProcessingResponse{headersReply(true, destination), streamedReply(true, body, true)}, nil
				case *extprocv3.ProcessingRequest_ResponseBody:
					if duplex {
						return []*extprocv3.ProcessingResponse{streamedReply(false, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())}, nil
					}
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			mode := &extprocfilterv3.ProcessingMode{RequestBodyMode: tt.mode, ResponseBodyMode: tt.mode}
			if duplex {
				mode.RequestTrailerMode, mode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND, extprocfilterv3.ProcessingMode_SEND
			}
			s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: mode, ServeFromFallbacks: true,
				ForwardingNamespaces: []string{"envoy.lb", "envoy.lb.subset_hint"},
				Routes:               []Route{{PathPrefix: "/", DynamicMetadata: map[string]map[string]any{"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": up}}}}})
			code, out := do(t, s, `{"hello":"world"}`)
			require.Equal(t, 200, code, out)
			ex := s.Exchanges()[0]
			require.Equal(t, up, ex.Upstream)
			var kinds []string
			for _, msg := range ex.Sent {
				kind := messageKind(msg)
				kinds = append(kinds, kind)
				fm := msg.GetMetadataContext().GetFilterMetadata()
				assert.Contains(t, fm, "envoy.lb.subset_hint", "%s: the forwarded namespaces", kind)
				served := fm["envoy.lb"].GetFields()["x-gateway-destination-endpoint-served"].GetStringValue()
				if msg.GetResponseHeaders() != nil || msg.GetResponseBody() != nil || msg.GetResponseTrailers() != nil {
					assert.Equal(t, up, served, "%s: the endpoint that served", kind)
				} else {
					assert.Empty(t, served, "%s: nothing served yet", kind)
				}
			}
			assert.Contains(t, kinds, MessageResponseBody)
		})
	}
}

// streamedReply is a FULL_DUPLEX_STREAMED body reply returning chunk as it came.
func streamedReply(request bool, chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}
