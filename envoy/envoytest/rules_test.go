package envoytest

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// script is a fake ext_proc server: for every message it receives, reply returns the
// messages to send back (nil: none), or an error to end the stream with.
type script struct {
	extprocv3.UnimplementedExternalProcessorServer
	reply func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error)
}

func (s *script) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		out, err := s.reply(req)
		if err != nil {
			return err
		}
		for _, r := range out {
			if err := stream.Send(r); err != nil {
				return err
			}
		}
	}
}

func startProcessor(t *testing.T, reply func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, &script{reply: reply})
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// echoUpstream answers with the request headers it received, one "k: v" per line.
func echoUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		for k, vs := range r.Header {
			for _, v := range vs {
				_, _ = io.WriteString(w, strings.ToLower(k)+": "+v+"\n")
			}
		}
		_, _ = io.WriteString(w, "body: "+string(body)+"\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func set(key string, value string, raw bool) *corev3.HeaderValueOption {
	hv := &corev3.HeaderValue{Key: key}
	if raw {
		hv.RawValue = []byte(value)
	} else {
		hv.Value = value
	}
	return &corev3.HeaderValueOption{Header: hv}
}

func headersReply(clear bool, opts ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	var m *extprocv3.HeaderMutation
	if len(opts) > 0 {
		m = &extprocv3.HeaderMutation{SetHeaders: opts}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: m, ClearRouteCache: clear}}}}
}

func continueAll(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return headersReply(false)
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	default:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	}
}

func do(t *testing.T, s *Server, body string, headers ...string) (int, string) {
	t.Helper()
	method := http.MethodPost
	if body == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequest(method, s.URL+"/v1/test", strings.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func newPlane(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.MessageTimeout == 0 {
		// Envoy's 200 ms default timer tripped on a CI machine starved by parallel
		// builds (a 504 in TestEveryMessageCarriesTheForwardedMetadata): the tests that
		// are about the timer set their own.
		cfg.MessageTimeout = time.Minute
	}
	s := NewServer(cfg)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func TestHeaderMutationRules(t *testing.T) {
	up := echoUpstream(t)
	tests := []struct {
		name       string
		allowEnvoy bool
		failOpen   bool
		set        []*corev3.HeaderValueOption
		remove     []string
		status     int
		has        []string
		hasNot     []string
		ignored    int
	}{
		{name: "raw_value sets the header", set: []*corev3.HeaderValueOption{set("x-a", "1", true)}, status: 200, has: []string{"x-a: 1"}},
		{name: "value alone arrives empty", set: []*corev3.HeaderValueOption{set("x-a", "1", false)}, status: 200, has: []string{"x-a: \n"}, hasNot: []string{"x-a: 1"}},
		{name: "x-envoy headers are ignored", set: []*corev3.HeaderValueOption{set("x-envoy-original-dst-host", "1.2.3.4:5", true)}, status: 200, hasNot: []string{"x-envoy-original-dst-host"}, ignored: 1},
		{name: "x-envoy headers with allow_envoy", allowEnvoy: true, set: []*corev3.HeaderValueOption{set("x-envoy-foo", "bar", true)}, status: 200, has: []string{"x-envoy-foo: bar"}},
		{name: "host cannot be set", set: []*corev3.HeaderValueOption{set("host", "evil", true)}, status: 200, ignored: 1},
		{name: "value and raw_value together are an error", set: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", Value: "1", RawValue: []byte("2")}}}, status: 500},
		// mutation_utils.cc, applyHeaderMutations: headerNameIsValid / headerValueIsValid.
		{name: "a value with CR LF is an error", set: []*corev3.HeaderValueOption{set("x-a", "1\r\nx-b: 2", true)}, status: 500},
		{name: "a value with NUL is an error", set: []*corev3.HeaderValueOption{set("x-a", "1\x002", true)}, status: 500},
		{name: "tabs and obs-text are values", set: []*corev3.HeaderValueOption{set("x-a", "1\t\xe9", true)}, status: 200, has: []string{"x-a: 1\t\xe9"}},
		{name: "a name with a space is an error", set: []*corev3.HeaderValueOption{set("x a", "1", true)}, status: 500},
		{name: "an upper-case name is lowered", set: []*corev3.HeaderValueOption{set("X-Up", "1", true)}, status: 200, has: []string{"x-up: 1"}},
		{name: "removing a name with a space is an error", remove: []string{"x a"}, status: 500},
		// Checker::isAllowed: APPEND on a pseudo-header, and any removal of one, is ignored.
		{name: "appending to :path is ignored", set: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: ":path", RawValue: []byte("/x")}, Append: wrapperspb.Bool(true)}}, status: 200, ignored: 1},
		{name: "removing :path is ignored", remove: []string{":path"}, status: 200, ignored: 1},
		// ext_proc.cc, onReceiveMessage: a rejected mutation is not a spurious message;
		// it ends the request with status_on_error even when failing open.
		{name: "a rejected mutation fails even when failing open", failOpen: true, set: []*corev3.HeaderValueOption{set("x-a", "1\n", true)}, status: 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestHeaders() != nil {
					r := headersReply(true, append([]*corev3.HeaderValueOption{set("x-gateway-destination-endpoint", up, true)}, tt.set...)...)
					r.GetRequestHeaders().Response.HeaderMutation.RemoveHeaders = tt.remove
					return []*extprocv3.ProcessingResponse{r}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			s := newPlane(t, Config{ProcessorAddress: addr, AllowEnvoyMutations: tt.allowEnvoy, FailureModeAllow: tt.failOpen})
			code, body := do(t, s, "")
			require.Equal(t, tt.status, code, body)
			for _, h := range tt.has {
				assert.Contains(t, body, h)
			}
			for _, h := range tt.hasNot {
				assert.NotContains(t, body, h)
			}
			assert.Len(t, s.Exchanges()[0].IgnoredMutations, tt.ignored)
		})
	}
}

// TestSetHeadersCombineWithExistingValuesAsEnvoyDoes pins how a set combines with a
// header the client already sent (mutation_utils.cc): the default overwrites, and
// append_action is honoured when not the default.
func TestSetHeadersCombineWithExistingValuesAsEnvoyDoes(t *testing.T) {
	up := echoUpstream(t)
	withAction := func(a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		o := set("x-a", "kvroute", true)
		o.AppendAction = a
		return o
	}
	appendFlag := set("x-a", "kvroute", true)
	appendFlag.Append = wrapperspb.Bool(true)
	tests := []struct {
		name       string
		opt        *corev3.HeaderValueOption
		clientSent bool
		want       []string
	}{
		{"the default overwrites", set("x-a", "kvroute", true), true, []string{"kvroute"}},
		{"the deprecated append flag appends", appendFlag, true, []string{"client", "kvroute"}},
		{"OVERWRITE_IF_EXISTS_OR_ADD overwrites", withAction(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), true, []string{"kvroute"}},
		{"OVERWRITE_IF_EXISTS_OR_ADD adds", withAction(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD), false, []string{"kvroute"}},
		{"ADD_IF_ABSENT keeps the client's", withAction(corev3.HeaderValueOption_ADD_IF_ABSENT), true, []string{"client"}},
		{"ADD_IF_ABSENT adds", withAction(corev3.HeaderValueOption_ADD_IF_ABSENT), false, []string{"kvroute"}},
		{"OVERWRITE_IF_EXISTS does not add", withAction(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS), false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestHeaders() != nil {
					return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true), tt.opt)}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			s := newPlane(t, Config{ProcessorAddress: addr})
			var headers []string
			if tt.clientSent {
				headers = []string{"x-a", "client"}
			}
			code, body := do(t, s, "", headers...)
			require.Equal(t, http.StatusOK, code, body)
			var got []string
			for _, line := range strings.Split(body, "\n") {
				if v, ok := strings.CutPrefix(line, "x-a: "); ok {
					got = append(got, v)
				}
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRouteCacheClearedOnlyWithAHeaderMutation(t *testing.T) {
	up := echoUpstream(t)
	for _, withMutation := range []bool{true, false} {
		addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			if req.GetRequestHeaders() != nil {
				if withMutation {
					return []*extprocv3.ProcessingResponse{headersReply(true, set("x-a", "1", true))}, nil
				}
				return []*extprocv3.ProcessingResponse{headersReply(true)}, nil
			}
			return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
		})
		s := newPlane(t, Config{ProcessorAddress: addr})
		do(t, s, "", "x-gateway-destination-endpoint", up)
		assert.Equal(t, withMutation, s.Exchanges()[0].RouteCacheCleared)
	}
}

// bodyReplyWithDestination answers a request body with a header mutation naming up.
func bodyReplyWithDestination(up string, streamedEcho []byte) *extprocv3.ProcessingResponse {
	common := &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-gateway-destination-endpoint", up, true)}}}
	if streamedEcho != nil {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: streamedEcho, EndOfStream: true}}}
	}
	return requestBodyReply(common)
}

func TestBodyReplyHeaderMutationAppliesOnlyInBuffered(t *testing.T) {
	up := echoUpstream(t)
	tests := []struct {
		name   string
		mode   extprocfilterv3.ProcessingMode_BodySendMode
		status int
	}{
		{"BUFFERED applies it", buffered, 200},
		{"STREAMED ignores it", streamed, 503},
		{"FULL_DUPLEX_STREAMED ignores it", fullDuplex, 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body []byte
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				switch r := req.GetRequest().(type) {
				case *extprocv3.ProcessingRequest_RequestHeaders:
					if tt.mode == fullDuplex {
						return nil, nil // the headers reply waits for the body
					}
					return []*extprocv3.ProcessingResponse{headersReply(false)}, nil
				case *extprocv3.ProcessingRequest_RequestBody:
					body = append(body, r.RequestBody.GetBody()...)
					if tt.mode == fullDuplex {
						if !r.RequestBody.GetEndOfStream() {
							return nil, nil
						}
						return []*extprocv3.ProcessingResponse{headersReply(false), bodyReplyWithDestination(up, body)}, nil
					}
					return []*extprocv3.ProcessingResponse{bodyReplyWithDestination(up, nil)}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			mode := &extprocfilterv3.ProcessingMode{RequestBodyMode: tt.mode, RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND}
			s := newPlane(t, Config{ProcessorAddress: addr, ProcessingMode: mode})
			code, out := do(t, s, `{"hello":"world"}`)
			assert.Equal(t, tt.status, code, out)
			if tt.status == 200 {
				assert.Contains(t, out, `body: {"hello":"world"}`)
			} else {
				assert.NotEmpty(t, s.Exchanges()[0].IgnoredMutations)
			}
		})
	}
}

func TestBufferLimitGives413(t *testing.T) {
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, BufferLimit: 10, ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered}})
	code, _ := do(t, s, strings.Repeat("x", 11))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
}

func TestProcessorFailures(t *testing.T) {
	up := echoUpstream(t)
	failing := map[string]func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error){
		"gRPC error": func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			return nil, status.Error(codes.Internal, "boom")
		},
		"message timeout": func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			time.Sleep(300 * time.Millisecond)
			return nil, nil
		},
		"spurious reply": func(*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
			return []*extprocv3.ProcessingResponse{{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}}, nil
		},
	}
	tests := []struct {
		name      string
		failOpen  bool
		wantClose int
	}{
		{"gRPC error", false, 500}, {"gRPC error", true, 200},
		{"message timeout", false, 504}, {"message timeout", true, 200},
		{"spurious reply", false, 500}, {"spurious reply", true, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name+map[bool]string{true: " fail open", false: " fail closed"}[tt.failOpen], func(t *testing.T) {
			addr := startProcessor(t, failing[tt.name])
			// The timer trips only the processor that sleeps past it; for the others it is
			// long enough that a saturated machine, slow to answer, never trips it (a 504
			// in place of their 500).
			timeout := time.Minute
			if tt.name == "message timeout" {
				timeout = 50 * time.Millisecond
			}
			s := newPlane(t, Config{ProcessorAddress: addr, FailureModeAllow: tt.failOpen, MessageTimeout: timeout})
			// The client names the upstream itself so a request that continues unmodified
			// can reach it.
			code, body := do(t, s, "", "x-gateway-destination-endpoint", up)
			assert.Equal(t, tt.wantClose, code, body)
		})
	}
}

func TestCleanCloseContinuesUnmodified(t *testing.T) {
	up := echoUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, closer{})
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	s := newPlane(t, Config{ProcessorAddress: ln.Addr().String()})
	code, body := do(t, s, "", "x-gateway-destination-endpoint", up)
	assert.Equal(t, 200, code, body)
	code, _ = do(t, s, "")
	assert.Equal(t, 503, code, "unmodified and without a destination: no upstream")
}

// closer ends every stream cleanly without replying.
type closer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (closer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	_, err := stream.Recv()
	return err
}

func TestOriginalDstPicksOnlyALiteralAddress(t *testing.T) {
	up := echoUpstream(t)
	tests := []struct {
		value  string
		status int
	}{
		{up, 200},
		{"localhost:" + strings.Split(up, ":")[1], 503},
		{up + "," + up, 503},
		{"", 503},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestHeaders() != nil && tt.value != "" {
					return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", tt.value, true))}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			s := newPlane(t, Config{ProcessorAddress: addr})
			code, _ := do(t, s, "")
			assert.Equal(t, tt.status, code)
		})
	}
}

func TestOnlyReceivingNamespacesAreKept(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		r := continueAll(req)
		if req.GetRequestHeaders() != nil {
			r = headersReply(true, set("x-gateway-destination-endpoint", up, true))
			r.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"a": "1"}, "other": map[string]any{"b": "2"}})
		}
		return []*extprocv3.ProcessingResponse{r}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, ReceivingNamespaces: []string{"envoy.lb"}})
	do(t, s, "")
	md := s.Exchanges()[0].DynamicMetadata
	assert.Contains(t, md, "envoy.lb")
	assert.NotContains(t, md, "other")
}

func TestProtocolConfigOnTheFirstMessageOnly(t *testing.T) {
	up := echoUpstream(t)
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		if req.GetRequestHeaders() != nil {
			return []*extprocv3.ProcessingResponse{headersReply(true, set("x-gateway-destination-endpoint", up, true))}, nil
		}
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := newPlane(t, Config{ProcessorAddress: addr, SendProtocolConfig: true,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered, ResponseBodyMode: streamed}})
	code, _ := do(t, s, "abc")
	require.Equal(t, 200, code)
	sent := s.Exchanges()[0].Sent
	require.Greater(t, len(sent), 2)
	assert.Equal(t, buffered, sent[0].GetProtocolConfig().GetRequestBodyMode())
	assert.Equal(t, streamed, sent[0].GetProtocolConfig().GetResponseBodyMode())
	for _, m := range sent[1:] {
		assert.Nil(t, m.GetProtocolConfig())
	}
}

// TestStreamedResponseOutsideFullDuplexIsSpurious pins processor_state.cc,
// handleStreamedBodyCallback: a streamed_response in STREAMED, or a plain body reply in
// FULL_DUPLEX_STREAMED, is a FailedPrecondition, a spurious message: failing closed,
// 500; failing open, the processor is left out and the request continues unmodified,
// except in FULL_DUPLEX_STREAMED, which does not fail open (processorFailed).
func TestStreamedResponseOutsideFullDuplexIsSpurious(t *testing.T) {
	up := echoUpstream(t)
	for _, tt := range []struct {
		name     string
		mode     extprocfilterv3.ProcessingMode_BodySendMode
		reply    func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		failOpen bool // whether failure_mode_allow lets the request continue
	}{
		{"a streamed_response in STREAMED", streamed, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			return streamedReply(true, []byte("changed"), true)
		}, true},
		{"a plain body reply in FULL_DUPLEX_STREAMED", fullDuplex, continueAll, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
				if req.GetRequestBody() != nil {
					return []*extprocv3.ProcessingResponse{tt.reply(req)}, nil
				}
				return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
			})
			for _, failOpen := range []bool{true, false} {
				s := newPlane(t, Config{ProcessorAddress: addr, FailureModeAllow: failOpen,
					ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: tt.mode}})
				code, body := do(t, s, "original", "x-gateway-destination-endpoint", up)
				if failOpen && tt.failOpen {
					assert.Equal(t, http.StatusOK, code, body)
					assert.Contains(t, body, "body: original")
				} else {
					assert.Equal(t, http.StatusInternalServerError, code, body)
					assert.Contains(t, body, "spurious")
				}
			}
		})
	}
}
