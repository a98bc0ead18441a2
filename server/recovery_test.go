package server_test

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenize"
)

// panicOnce panics the first time a worker's status is observed: a fault inside the
// stream handler after the request was booked.
type panicOnce struct{ fired atomic.Bool }

func (p *panicOnce) Observe(string, string, int) {
	if p.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
}

// TestAPanickingStreamFailsAloneAndReleasesItsBooking: a panic in one ext_proc stream
// fails that request (Envoy fails closed: 500), is counted, frees the stream's booking,
// and the process goes on serving the next request.
func TestAPanickingStreamFailsAloneAndReleasesItsBooking(t *testing.T) {
	w := fakeworker.New("w0")
	t.Cleanup(w.Close)
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	require.NoError(t, idx.SetWorker("w0", 0))
	bookings := scoring.NewBookings()
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	r, err := router.New(router.Config{BlockSize: 4, Workers: []router.Worker{{Name: "w0", Address: w.Address}}}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true,
	})
	require.NoError(t, err)
	cfg := filter.DefaultConfig()
	reg := prometheus.NewRegistry()
	ext, err := filter.New(cfg, filter.Deps{Router: r, Health: &panicOnce{}, Metrics: filter.NewMetrics(reg)})
	require.NoError(t, err)

	gs := grpc.NewServer(append(server.Options(cfg.MaxBodyBytes), server.Recovery(slog.New(slog.DiscardHandler), server.NewMetrics(reg))...)...)
	extprocv3.RegisterExternalProcessorServer(gs, ext)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	envoy := envoytest.NewServer(envoytest.Config{
		ProcessorAddress: ln.Addr().String(), MessageTimeout: time.Minute,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
	})
	t.Cleanup(func() { require.NoError(t, envoy.Close()) })

	post := func() int {
		resp, err := envoy.Client().Post(envoy.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		// To its end: the data plane passes the response's headers on as soon as their
		// reply is applied (as Envoy does), and the booking is released at the
		// response's end, before its last bytes reach the client.
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusInternalServerError, post(), "the panicking stream fails closed")
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_server_panics_total gRPC calls that panicked, by method; each failed only its own stream or call (gRPC Internal).
# TYPE kvroute_server_panics_total counter
kvroute_server_panics_total{method="/envoy.service.ext_proc.v3.ExternalProcessor/Process"} 1
`), "kvroute_server_panics_total"), "counted once, under the ext_proc method")
	require.Eventually(t, func() bool { return bookings.Load("w0") == scoring.Load{} }, 5*time.Second, time.Millisecond, "the booking is released")
	assert.Equal(t, http.StatusOK, post(), "the process still serves")
	assert.Equal(t, scoring.Load{}, bookings.Load("w0"))
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_filter_completions_total Routed requests whose booking was released, by worker and outcome (success, upstream_error, cancelled).
# TYPE kvroute_filter_completions_total counter
kvroute_filter_completions_total{outcome="cancelled",worker="w0"} 1
kvroute_filter_completions_total{outcome="success",worker="w0"} 1
`), "kvroute_filter_completions_total"), "the panicking stream's booking was released exactly once")
}

// panickingHealth is a unary service whose handler panics.
type panickingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (panickingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("injected fault")
}

// TestAPanickingUnaryCallFailsAlone: the unary side of the recovery: the call gets
// Internal, is counted under its method, and the server answers the next call.
func TestAPanickingUnaryCallFailsAlone(t *testing.T) {
	reg := prometheus.NewRegistry()
	gs := grpc.NewServer(server.Recovery(slog.New(slog.DiscardHandler), server.NewMetrics(reg))...)
	healthpb.RegisterHealthServer(gs, panickingHealth{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	for range 2 {
		_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		assert.Equal(t, codes.Internal, status.Code(err), "%v", err)
	}
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kvroute_server_panics_total gRPC calls that panicked, by method; each failed only its own stream or call (gRPC Internal).
# TYPE kvroute_server_panics_total counter
kvroute_server_panics_total{method="/grpc.health.v1.Health/Check"} 2
`), "kvroute_server_panics_total"))
}
