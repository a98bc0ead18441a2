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
