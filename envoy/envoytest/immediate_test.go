package envoytest

import (
	"io"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"
)

func immediateReply(code typev3.StatusCode, body string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: code}, Body: []byte(body)}}}
}

// TestImmediateResponseStatusAndMetadata pins ext_proc.cc, sendImmediateResponse: a
// status under 200 is sent as 200 (isValidHttpStatus); and onReceiveMessage: an
// immediate response's dynamic metadata is kept (setDecoderDynamicMetadata).
func TestImmediateResponseStatusAndMetadata(t *testing.T) {
	for _, tt := range []struct {
		code typev3.StatusCode
		want int
	}{{typev3.StatusCode_Continue, 200}, {0, 200}, {typev3.StatusCode_TooManyRequests, 429}} {
		addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			r := immediateReply(tt.code, "local")
			r.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"a": "1"}})
			return []*extprocv3.ProcessingResponse{r}, nil
		})
		s := newPlane(t, Config{ProcessorAddress: addr, ReceivingNamespaces: []string{"envoy.lb"}})
		code, body := do(t, s, "")
		assert.Equal(t, tt.want, code)
		assert.Equal(t, "local", body)
		assert.Contains(t, s.Exchanges()[0].DynamicMetadata, "envoy.lb")
	}
}

// TestImmediateResponseAfterTheResponseStartedResets pins filter_manager.cc,
// FilterManager::sendLocalReply: once the response headers went to the client, a local
// reply resets the stream and none of its body is sent. In STREAMED (and
// FULL_DUPLEX_STREAMED) Envoy sends the response headers on as soon as their reply is
// applied (processor_state.cc, handleHeadersResponse: continueIfNecessary); envoytest
// held them until the first body bytes, so a reset at the first chunk looked to the
// client like a connection closed before any response.
func TestImmediateResponseAfterTheResponseStartedResets(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		case *extprocv3.ProcessingRequest_ResponseBody:
			return []*extprocv3.ProcessingResponse{immediateReply(typev3.StatusCode_TooManyRequests, "IMMEDIATE")}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: &extprocfilterv3.ProcessingMode{ResponseBodyMode: streamed}})
	resp, err := s.Client().Get(s.URL + "/v1/test")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the response had started")
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Error(t, err, "the stream is reset")
	assert.False(t, strings.Contains(string(out), "IMMEDIATE"), "none of the local reply reaches the client: %q", out)
}
