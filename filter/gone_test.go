package filter

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// countingRouter counts the requests it is asked to route and routes none.
type countingRouter struct{ calls int }

func (c *countingRouter) Route(context.Context, *router.Request) (*router.Decision, error) {
	c.calls++
	return nil, context.Canceled
}

// TestABodyWhoseStreamIsGoneIsNotParsed: Envoy gives up on a stream (its
// message_timeout) while its body waits for a CPU. Under overload, parsing and
// encoding bodies nobody waits for any more is what keeps the backlog growing: such a
// body is neither parsed nor routed, and the request is counted as cancelled.
func TestABodyWhoseStreamIsGoneIsNotParsed(t *testing.T) {
	for _, mode := range []BodyMode{ModeBuffered, ModeFullDuplex} {
		t.Run(string(mode), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			rt := &countingRouter{}
			cfg := DefaultConfig()
			cfg.RequestBodyMode = mode
			srv, err := New(cfg, Deps{Router: rt, Metrics: NewMetrics(reg)})
			require.NoError(t, err)
			st := srv.newStream(context.Background())
			defer st.release(outcomeCancelled)
			headers := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			}}}
			_, err = st.handle(context.Background(), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}})
			require.NoError(t, err)
			gone, cancel := context.WithCancel(context.Background())
			cancel()
			replies, err := st.handle(gone, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), EndOfStream: true}}})
			require.NoError(t, err)
			assert.Empty(t, replies, "nobody reads a reply")
			assert.Zero(t, rt.calls, "the body of a stream already gone was parsed and routed")
			assert.Equal(t, 1.0, testutil.ToFloat64(srv.metrics.requests.WithLabelValues(outcomeCancelled)))
		})
	}
}
