package filter_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
)

// requestRecorder passes decisions on, keeping the last request routed by body.
type requestRecorder struct {
	filter.Router
	last *router.Request
}

func (r *requestRecorder) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	r.last = req
	return r.Router.Route(ctx, req)
}

// TestBodyAddSpecialTokensReachesTheRouter: the body's add_special_tokens and
// truncate_prompt_tokens are handed to the router, which encodes the prompt as the
// engine does.
func TestBodyAddSpecialTokensReachesTheRouter(t *testing.T) {
	rec := &requestRecorder{}
	p := newPlane(t, planeOptions{wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	resp, _ := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello","add_special_tokens":false,"truncate_prompt_tokens":7}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotNil(t, rec.last)
	require.NotNil(t, rec.last.AddSpecialTokens)
	assert.False(t, *rec.last.AddSpecialTokens)
	require.NotNil(t, rec.last.TruncatePromptTokens)
	assert.Equal(t, int64(7), *rec.last.TruncatePromptTokens)
}

// TestCompletionsWithPromptEmbedsAreRoutedByLoad: a completions body whose prompt is
// its prompt_embeds (vLLM's --enable-prompt-embeds), with or without a text prompt, is
// served, routed by load and counted as a prompt kvroute cannot compute, never refused
// for lacking a prompt.
func TestCompletionsWithPromptEmbedsAreRoutedByLoad(t *testing.T) {
	p := newPlane(t, planeOptions{})
	fallbacks := func() float64 {
		return p.counter(t, "kvroute_router_prompt_fallbacks_total", map[string]string{"reason": router.FallbackUnsupported})
	}
	for i, body := range []string{`{"model":"m","prompt_embeds":"AAAA"}`, `{"model":"m","prompt":"hello","prompt_embeds":["AAAA"]}`} {
		resp, _ := p.post(t, "/v1/completions", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, float64(i+1), fallbacks(), body)
	}
}
