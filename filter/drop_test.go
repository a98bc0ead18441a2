package filter

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// TestTheBodyIsDroppedOnceRouted drives a stream message by message: once the request is
// routed the stream holds no reference to its body, so a long generation does not keep
// up to max_body_bytes alive (issue 8).
func TestTheBodyIsDroppedOnceRouted(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	require.NoError(t, idx.SetWorker("w0", 0))
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	r, err := router.New(router.Config{BlockSize: 4, Workers: []router.Worker{{Name: "w0", Address: "127.0.0.1:1"}}}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: scoring.NewBookings(), Picker: picker,
	})
	require.NoError(t, err)
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 100_000) + `"}`
	for _, mode := range []BodyMode{ModeBuffered, ModeFullDuplex} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.RequestBodyMode = mode
			srv, err := New(cfg, Deps{Router: r})
			require.NoError(t, err)
			st := srv.newStream(context.Background())
			defer st.release(outcomeCancelled)
			headers := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
			}}}
			_, err = st.handle(context.Background(), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}})
			require.NoError(t, err)
			half := len(body) / 2
			for i, chunk := range []string{body[:half], body[half:]} {
				if mode == ModeBuffered && i == 0 {
					continue // BUFFERED sends the body whole
				}
				eos := i == 1
				if mode == ModeBuffered {
					chunk = body
				}
				_, err = st.handle(context.Background(), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
					RequestBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: eos}}})
				require.NoError(t, err)
				if !eos {
					assert.Len(t, st.body, half, "held while the body is read")
				}
			}
			require.NotNil(t, st.decision, "routed")
			assert.Nil(t, st.body, "dropped once routed")
		})
	}
}
