package envoytest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requestBodyReply answers a request body with common.
func requestBodyReply(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}}
}

// TestTheProcessorSeesContentLengthInEveryBodyMode pins ext_proc.cc, decodeHeaders and
// encodeHeaders: the headers message is built before content-length is dropped (in
// STREAMED, FULL_DUPLEX_STREAMED, BUFFERED_PARTIAL), so the processor sees it; the
// client then gets the response without it.
func TestTheProcessorSeesContentLengthInEveryBodyMode(t *testing.T) {
	up := echoUpstream(t)
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{buffered, partial, streamed, fullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			var body []byte
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if mode != fullDuplex {
					if req.GetRequestHeaders() != nil {
						return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
					}
					return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
				}
				switch r := req.GetRequest().(type) {
				case *extprocv3.ProcessingRequest_RequestBody:
					body = append(body, r.RequestBody.GetBody()...)
					if !r.RequestBody.GetEndOfStream() {
						return nil, nil
					}
					return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true)), streamedReply(true, body, true)}, nil
				case *extprocv3.ProcessingRequest_ResponseBody:
					return []*extprocv3.ProcessingResponse{streamedReply(false, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream())}, nil
				case *extprocv3.ProcessingRequest_RequestHeaders:
					return nil, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			pm := &extprocfilterv3.ProcessingMode{RequestBodyMode: mode, ResponseBodyMode: mode,
				RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND}
			s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: pm})
			resp, err := s.Client().Post(s.URL+"/v1/test", "application/json", strings.NewReader("hello"))
			require.NoError(t, err)
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
			assert.Contains(t, string(out), "body: hello")
			if mode == buffered {
				assert.Equal(t, int64(len(out)), resp.ContentLength, "BUFFERED keeps it")
			} else {
				assert.Equal(t, int64(-1), resp.ContentLength, "the client gets none")
			}
			var requestHeaders, responseHeaders int
			for _, m := range s.Exchanges()[0].Sent {
				if hs := m.GetRequestHeaders(); hs != nil {
					requestHeaders++
					assert.Equal(t, "5", headerOf(hs, "content-length"))
				}
				if hs := m.GetResponseHeaders(); hs != nil {
					responseHeaders++
					assert.NotEmpty(t, headerOf(hs, "content-length"))
				}
			}
			assert.Equal(t, 1, requestHeaders, "the request's headers went to the processor")
			assert.Equal(t, 1, responseHeaders, "the response's headers went to the processor")
		})
	}
}

// TestAContentLengthTheProcessorSetsIsSkippedWhereTheModeDropsIt pins mutation_utils.cc,
// applyHeaderMutations (remove_content_length): in STREAMED the response's
// content-length is gone and one the processor sets is skipped, where envoytest used
// to send it to the client over a body of another length.
func TestAContentLengthTheProcessorSetsIsSkippedWhereTheModeDropsIt(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("content-length", "9999", true)}}}}}}}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: &extprocfilterv3.ProcessingMode{ResponseBodyMode: streamed}})
	resp, err := s.Client().Get(s.URL + "/v1/test")
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, int64(-1), resp.ContentLength)
	assert.Contains(t, string(out), "body: ")
	assert.Contains(t, s.Exchanges()[0].IgnoredMutations, "set content-length: the body mode drops it")
}

// TestBufferedBodyMutationAgainstContentLength pins processor_state.cc,
// validateContentLength: in BUFFERED with the headers sent, a body mutation must match
// the content-length the headers carry after this reply's header mutation (clear_body
// and streamed_response count as empty), an error (500) otherwise; a message without
// content-length (chunked) is not checked. With the header mode SKIP, Envoy holds no
// headers: the body reply's header mutation is ignored and nothing is checked.
func TestBufferedBodyMutationAgainstContentLength(t *testing.T) {
	up := echoUpstream(t)
	dest := set("x-gateway-destination-endpoint", up, true)
	replace := &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("changed")}}
	tests := []struct {
		name      string
		chunked   bool
		skip      bool
		mutation  *extprocv3.BodyMutation
		setLength string
		status    int
		body      string
	}{
		{name: "replaced with a matching content-length", mutation: replace, setLength: "7", status: 200, body: "body: changed"},
		{name: "replaced, content-length left as it was", mutation: replace, status: 500},
		{name: "replaced in a chunked request, no content-length", chunked: true, mutation: replace, status: 200, body: "body: changed"},
		{name: "cleared, content-length left as it was", mutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}, status: 500},
		{name: "cleared with content-length 0", mutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}, setLength: "0", status: 200, body: "body: \n"},
		{name: "streamed_response counts as empty", mutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte("x")}}}, status: 500},
		{name: "headers SKIP: mutation ignored, body replaced unchecked", skip: true, mutation: replace, status: 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestBody() != nil {
					opts := []*corev3.HeaderValueOption{dest}
					if tt.setLength != "" {
						opts = append(opts, set("content-length", tt.setLength, true))
					}
					return []*extprocv3.ProcessingResponse{requestBodyReply(&extprocv3.CommonResponse{
						HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: opts}, BodyMutation: tt.mutation})}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			pm := &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered}
			if tt.skip {
				pm.RequestHeaderMode = skip
			}
			s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: pm})
			var body io.Reader = strings.NewReader("original")
			if tt.chunked {
				body = io.MultiReader(strings.NewReader("original")) // no length known: chunked
			}
			req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/test", body)
			require.NoError(t, err)
			resp, err := s.Client().Do(req)
			require.NoError(t, err)
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, tt.status, resp.StatusCode, string(out))
			if tt.body != "" {
				assert.Contains(t, string(out), tt.body)
			}
			if tt.skip {
				assert.Contains(t, s.Exchanges()[0].IgnoredMutations, "header mutation in a body reply whose headers were not sent (SKIP)")
			}
		})
	}
}

// TestBufferedPartialSendsWhatFitsThenTheRestUnseen pins ext_proc.cc,
// handleDataBufferedPartialMode: BUFFERED_PARTIAL never answers 413; a body past the
// buffer limit goes to the processor in one message without end_of_stream (what was
// queued when the limit was passed) and the rest goes on unseen; a body that fits goes
// whole, with end_of_stream. Both directions.
func TestBufferedPartialSendsWhatFitsThenTheRestUnseen(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	for _, size := range []int{20, 100} {
		s := newPlane(t, Config{ProcessorAddress: addr, BufferLimit: 64,
			ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: partial, ResponseBodyMode: partial}})
		body := strings.Repeat("x", size)
		code, out := do(t, s, body)
		require.Equal(t, http.StatusOK, code, out)
		assert.Contains(t, out, "body: "+body+"\n")
		var reqBodies, respBodies []*extprocv3.HttpBody
		for _, m := range s.Exchanges()[0].Sent {
			if b := m.GetRequestBody(); b != nil {
				reqBodies = append(reqBodies, b)
			}
			if b := m.GetResponseBody(); b != nil {
				respBodies = append(respBodies, b)
			}
		}
		require.Len(t, reqBodies, 1)
		require.Len(t, respBodies, 1)
		if size < 64 {
			assert.Equal(t, body, string(reqBodies[0].GetBody()))
			assert.True(t, reqBodies[0].GetEndOfStream())
		} else {
			assert.Equal(t, body[:65], string(reqBodies[0].GetBody()))
			assert.False(t, reqBodies[0].GetEndOfStream())
			assert.Len(t, respBodies[0].GetBody(), 65)
			assert.False(t, respBodies[0].GetEndOfStream())
		}
	}
}

// TestABufferedResponsePastTheLimitIs500 pins filter_manager.cc,
// ActiveStreamEncoderFilter::responseDataTooLarge: a BUFFERED response body past the
// buffer limit is Envoy's 500 (its headers not yet sent), where envoytest buffered any
// size.
func TestABufferedResponsePastTheLimitIs500(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, BufferLimit: 256, ProcessingMode: &extprocfilterv3.ProcessingMode{ResponseBodyMode: buffered}})
	code, _ := do(t, s, "", "x-pad", strings.Repeat("p", 300))
	assert.Equal(t, http.StatusInternalServerError, code)
	code, out := do(t, s, "")
	assert.Equal(t, http.StatusOK, code, out)
}

// TestAResponseWithoutABodySendsItsHeadersAlone pins ENVOY.md §1 on the response side:
// headers that end the stream (content-length 0) are the processor's only message in
// every body mode. envoytest used to send a BUFFERED or BUFFERED_PARTIAL processor an
// empty response body after them, which Envoy never does (an SGLang /close_session
// answer is such a response).
func TestAResponseWithoutABodySendsItsHeadersAlone(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(srv.Close)
	up := strings.TrimPrefix(srv.URL, "http://")
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{buffered, partial, streamed, fullDuplex} {
		t.Run(mode.String(), func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				switch r := req.GetRequest().(type) {
				case *extprocv3.ProcessingRequest_RequestHeaders:
					return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
				case *extprocv3.ProcessingRequest_ResponseBody:
					return nil, fmt.Errorf("a response body message for a response without a body: %v", r)
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			pm := &extprocfilterv3.ProcessingMode{ResponseBodyMode: mode}
			if mode == fullDuplex {
				pm.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
			}
			s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: pm})
			resp, err := s.Client().Get(s.URL + "/close_session")
			require.NoError(t, err)
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
			assert.Empty(t, out)
			var headers int
			for _, m := range s.Exchanges()[0].Sent {
				if hs := m.GetResponseHeaders(); hs != nil {
					headers++
					assert.True(t, hs.GetEndOfStream(), "the headers end the response")
				}
				assert.Nil(t, m.GetResponseBody())
			}
			assert.Equal(t, 1, headers)
		})
	}
}
