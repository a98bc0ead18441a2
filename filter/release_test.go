package filter_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func completions(t *testing.T, p *plane, outcome string) float64 {
	t.Helper()
	return p.counter(t, "kvroute_filter_completions_total", map[string]string{"outcome": outcome})
}

func TestBookingReleasedOnceOnEveryPath(t *testing.T) {
	for _, m := range modes[:2] {
		t.Run(m.name, func(t *testing.T) {
			t.Run("client cancels mid-stream", func(t *testing.T) {
				p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.envoy.URL+"/v1/chat/completions",
					strings.NewReader(chat("HANG_AFTER_FIRST_TOKEN", true)))
				resp, err := p.envoy.Client().Do(req)
				require.NoError(t, err)
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				require.NoError(t, err)
				assert.Contains(t, line, "t0", "the first token streamed through promptly")
				assert.False(t, p.idle(), "the request is still active on its worker")
				cancel()
				resp.Body.Close()
				p.waitIdle(t)
				assert.Equal(t, 1.0, completions(t, p, "cancelled"))
				assert.Equal(t, 0.0, completions(t, p, "success"))
			})
			t.Run("upstream error", func(t *testing.T) {
				p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
				resp, _ := p.post(t, "/v1/chat/completions", chat("FAIL_UPSTREAM", false))
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
				p.requireIdle(t)
				assert.Equal(t, 1.0, completions(t, p, "upstream_error"))
			})
			t.Run("success counts once", func(t *testing.T) {
				p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
				for range 3 {
					p.post(t, "/v1/chat/completions", chat("ok", true))
				}
				p.requireIdle(t)
				assert.Equal(t, 3.0, completions(t, p, "success"))
				assert.Equal(t, 0.0, completions(t, p, "cancelled"))
			})
		})
	}
}

// TestEnvoyDroppingTheStreamReleases plays Envoy by hand: the request is routed, then
// the gRPC stream is cancelled before any response arrives.
func TestEnvoyDroppingTheStreamReleases(t *testing.T) {
	p := newPlane(t, planeOptions{})
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	require.NoError(t, err)
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}}))
	_, err = stream.Recv()
	require.NoError(t, err)
	require.NoError(t, stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(chat("dropped", false)), EndOfStream: true}}}))
	reply, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, reply.GetRequestBody().GetResponse().GetHeaderMutation(), "routed")
	assert.False(t, p.idle())

	cancel()
	p.waitIdle(t)
	assert.Equal(t, 1.0, completions(t, p, "cancelled"))
}

// TestAnUpstreamErrorLeavesNoBlocksOnItsWorker: a worker that answers a 4xx or 5xx did
// not compute the prompt, so the blocks the decision recorded on it are forgotten (a
// hostile 1 M-token prompt that every engine refuses filled an approximate index with
// 65,536 blocks no worker held, evicting what they did hold); a served request's stay.
func TestAnUpstreamErrorLeavesNoBlocksOnItsWorker(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
			resp, _ := p.post(t, "/v1/chat/completions", chat("FAIL_UPSTREAM and a prompt long enough for several blocks", false))
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			p.requireIdle(t)
			assert.Zero(t, indexEntries(p), "the refused prompt's blocks are recorded")
			resp, _ = p.post(t, "/v1/chat/completions", chat("a served prompt long enough for several blocks", false))
			require.Equal(t, http.StatusOK, resp.StatusCode)
			p.requireIdle(t)
			assert.NotZero(t, indexEntries(p), "the served prompt's blocks are recorded")
		})
	}
}
