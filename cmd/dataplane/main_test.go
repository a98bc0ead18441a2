package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/internal/logbuf"
)

// pinner is a minimal ext_proc server in kvroute's place: it names one upstream in the
// destination header and passes every other message through.
type pinner struct {
	extprocv3.UnimplementedExternalProcessorServer
	upstream string
}

func (p pinner) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		var reply extprocv3.ProcessingResponse
		switch {
		case req.GetRequestHeaders() != nil:
			reply.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
				ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(p.upstream)}}}}}}}
		case req.GetRequestBody() != nil:
			reply.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}
		case req.GetResponseHeaders() != nil:
			reply.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}
		case req.GetResponseBody() != nil:
			reply.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}
		default:
			reply.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
		}
		if err := stream.Send(&reply); err != nil {
			return err
		}
	}
}

// TestAClientReachesTheWorkerTheProcessorNames: the data plane on a port of its own
// sends a client's OpenAI request where the processor says, and stops with its context.
func TestAClientReachesTheWorkerTheProcessorNames(t *testing.T) {
	worker := fakeworker.New("w0")
	defer worker.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	processor := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(processor, pinner{upstream: worker.Address})
	go func() { _ = processor.Serve(ln) }()
	defer processor.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &logbuf.Buffer{}, &logbuf.Buffer{}
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"-processor", ln.Addr().String(), "-listen", "127.0.0.1:0"}, stdout, stderr)
	}()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+`)
	require.Eventually(t, func() bool { return url.MatchString(stdout.String()) }, 10*time.Second, 10*time.Millisecond, "it says where it listens")

	resp, err := http.Post(url.FindString(stdout.String())+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "w0", resp.Header.Get("x-served-by"))
	require.Len(t, worker.Served(), 1)
	assert.Contains(t, string(worker.Served()[0].Body), `"content":"hi"`, "the body reaches the worker")

	cancel()
	select {
	case code := <-done:
		assert.Equal(t, 0, code)
	case <-time.After(10 * time.Second):
		t.Fatal("the data plane did not stop with its context")
	}
}

func TestAPortInUseIsAClearError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	stderr := &logbuf.Buffer{}
	assert.Equal(t, 1, run(context.Background(), []string{"-listen", ln.Addr().String()}, io.Discard, stderr))
	assert.Contains(t, stderr.String(), "address already in use")
	assert.Equal(t, 2, run(context.Background(), []string{"-no-such-flag"}, io.Discard, io.Discard))
}
