package filter_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// heldEncoder encodes with the file-free pair, but the first prompt waits for release
// once it has said it started (started has room for that one word, so the first prompt
// is held whether or not the test waits on started yet): a body held in decoding.
type heldEncoder struct {
	first            *atomic.Bool
	started, release chan struct{}
}

func newHeldEncoder() heldEncoder {
	return heldEncoder{first: new(atomic.Bool), started: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h heldEncoder) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	if h.first.CompareAndSwap(false, true) {
		h.started <- struct{}{}
		<-h.release
	}
	return tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}.EncodePrompt(ctx, p)
}

// TestBodiesPastTheConcurrentBoundAreRoutedByLoad: max_concurrent_body_bytes bounds
// the bodies parsed, rendered and encoded at once (each takes several times its size
// while it is); a body that does not fit beside those being decoded is served, routed
// by load on its model (counted as load_only_busy), and once the room is back bodies
// are decoded again.
func TestBodiesPastTheConcurrentBoundAreRoutedByLoad(t *testing.T) {
	enc := newHeldEncoder()
	p := newPlane(t, planeOptions{tokenizers: router.OneTokenizer(enc), filterCfg: func(c *filter.Config) {
		c.MaxBodyBytes, c.MaxConcurrentBodyBytes = 4096, 4096
	}})
	body := `{"model":"m","max_tokens":2,"prompt":"` + strings.Repeat("word ", 500) + `"}` // 2.5 KB: two do not fit
	held := make(chan int)
	go func() {
		resp, _ := p.post(t, "/v1/completions", body)
		held <- resp.StatusCode
	}()
	<-enc.started // the first body is being decoded

	resp, _ := p.post(t, "/v1/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a body past the bound is served")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only_busy"}))
	resp, _ = p.post(t, "/v1/completions", `{"model":"m","max_tokens":2,"prompt":"short"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}), "a body that fits beside it is decoded")

	close(enc.release)
	require.Equal(t, http.StatusOK, <-held)
	resp, _ = p.post(t, "/v1/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 3.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}), "the room is back")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only_busy"}))
	p.waitIdle(t)
}

func TestMaxConcurrentBodyBytesIsValidated(t *testing.T) {
	cfg := filter.DefaultConfig()
	cfg.MaxConcurrentBodyBytes = int64(cfg.MaxBodyBytes) - 1
	require.ErrorContains(t, cfg.Validate(), "max_concurrent_body_bytes: must be 0 (no bound) or at least max_body_bytes")
	cfg.MaxConcurrentBodyBytes = 0
	require.NoError(t, cfg.Validate())
}

// TestResponsesBodiesPastTheConcurrentBoundAreRoutedByLoad: a Responses API body
// rebuilt into a chat is rendered and encoded like a chat body (several times its size
// while it is), so it holds its max_concurrent_body_bytes until it is routed, and one
// that does not fit beside it is routed by load and counted as load_only_busy.
func TestResponsesBodiesPastTheConcurrentBoundAreRoutedByLoad(t *testing.T) {
	enc := newHeldEncoder()
	p := newPlane(t, planeOptions{responses: true, tokenizers: router.OneTokenizer(enc), filterCfg: func(c *filter.Config) {
		c.MaxBodyBytes, c.MaxConcurrentBodyBytes = 4096, 4096
	}})
	body := `{"model":"m","store":false,"input":"` + strings.Repeat("word ", 500) + `"}` // 2.5 KB: two do not fit
	held := make(chan int)
	go func() {
		resp, _ := p.post(t, "/v1/responses", body)
		held <- resp.StatusCode
	}()
	<-enc.started // the first body is being encoded

	resp, _ := p.post(t, "/v1/responses", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a body past the bound is served")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only_busy"}),
		"the first body holds its bytes while it is encoded")
	assert.Zero(t, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))

	close(enc.release)
	require.Equal(t, http.StatusOK, <-held)
	resp, _ = p.post(t, "/v1/responses", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}), "the room is back")
	p.waitIdle(t)
}
