package filter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
)

// generateBody is a body of vLLM's token-in/token-out API: model (omitted when ""),
// token_ids ids, and sampling_params.
func generateBody(model string, ids []int) string {
	b, _ := json.Marshal(ids)
	m := ""
	if model != "" {
		m = fmt.Sprintf(`"model":%q,`, model)
	}
	return fmt.Sprintf(`{%s"token_ids":%s,"sampling_params":{"max_tokens":16,"temperature":1.0}}`, m, b)
}

// rollout is an RL agent's episode as a rollout framework sends it to
// /inference/v1/generate: each turn's token ids are the previous turn's, its output's
// and the new observation's.
func rollout(turns, idsPerTurn, seed int) [][]int {
	var out [][]int
	var ids []int
	for turn := range turns {
		for i := range idsPerTurn {
			ids = append(ids, 1000*seed+100*turn+i+1)
		}
		out = append(out, append([]int(nil), ids...))
	}
	return out
}

func TestGenerateRolloutReturnsToItsHolder(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
			turns := rollout(3, 200, 1)
			first, body := p.post(t, "/inference/v1/generate", generateBody("m", turns[0]))
			require.Equal(t, http.StatusOK, first.StatusCode, body)
			holder := first.Header.Get("x-served-by")
			// Another request in flight on the holder: a small load gap, worth less than
			// recomputing the episode's prefix elsewhere.
			release := p.book(t, holder, 0, 3)
			for _, ids := range turns[1:] {
				resp, body := p.post(t, "/inference/v1/generate", generateBody("m", ids))
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				assert.Equal(t, holder, resp.Header.Get("x-served-by"))
			}
			release()
			p.requireIdle(t)
			assert.Equal(t, 3.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
			for _, w := range p.workers {
				for _, s := range w.Served() {
					assert.Equal(t, "/inference/v1/generate", s.Path)
					assert.True(t, strings.HasPrefix(string(s.Body), `{"model":"m","token_ids":[`), "the body reaches the engine as sent: %.60s", s.Body)
				}
			}
		})
	}
}

func TestGenerateBodyWithoutModel(t *testing.T) {
	turns := rollout(2, 200, 2)
	t.Run("the model header's model routes it on its prompt", func(t *testing.T) {
		p := newPlane(t, planeOptions{models: [][]string{{"m"}, {"m"}, {"other"}}, workers: 3})
		first, body := p.post(t, "/inference/v1/generate", generateBody("", turns[0]), "x-gateway-model-name", "m")
		require.Equal(t, http.StatusOK, first.StatusCode, body)
		holder := first.Header.Get("x-served-by")
		require.NotEqual(t, "w2", holder, "only workers serving the header's model are candidates")
		release := p.book(t, holder, 0, 3)
		second, body := p.post(t, "/inference/v1/generate", generateBody("", turns[1]), "x-gateway-model-name", "m")
		require.Equal(t, http.StatusOK, second.StatusCode, body)
		assert.Equal(t, holder, second.Header.Get("x-served-by"))
		release()
		p.requireIdle(t)
		assert.Equal(t, 2.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
	})
	t.Run("without a model header it goes by load to any worker", func(t *testing.T) {
		p := newPlane(t, planeOptions{models: [][]string{{"m"}, {"other"}}})
		for busy, idle := range map[string]string{"w0": "w1", "w1": "w0"} {
			release := p.book(t, busy, 0, 10)
			resp, body := p.post(t, "/inference/v1/generate", generateBody("", turns[0]))
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			assert.Equal(t, idle, resp.Header.Get("x-served-by"), "%s has 10 blocks in flight", busy)
			release()
		}
		p.requireIdle(t)
		assert.Equal(t, 2.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
	})
}

func TestGenerateBodiesKvrouteRefusesGetOpenAIErrors(t *testing.T) {
	p := newPlane(t, planeOptions{models: [][]string{{"m"}, {"m"}}})
	for _, tt := range []struct{ name, body, param string }{
		{"no token ids", `{"model":"m","sampling_params":{}}`, "token_ids"},
		{"empty token ids", `{"model":"m","token_ids":[],"sampling_params":{}}`, "token_ids"},
		{"no sampling params", `{"model":"m","token_ids":[1,2]}`, "sampling_params"},
		{"a model that is not a string", `{"model":7,"token_ids":[1,2],"sampling_params":{}}`, "model"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := p.post(t, "/inference/v1/generate", tt.body)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
			var e openAIError
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			require.NotNil(t, e.Error.Param)
			assert.Equal(t, tt.param, *e.Error.Param)
		})
	}
	for _, w := range p.workers {
		assert.Zero(t, w.count(), "no refused body reached a worker")
	}
	p.requireIdle(t)
}

func TestGeneratePathsEmptyRoutesThemByLoadUnread(t *testing.T) {
	p := newPlane(t, planeOptions{filterCfg: func(c *filter.Config) { c.GeneratePaths = nil }})
	resp, body := p.post(t, "/inference/v1/generate", `{"token_ids":"not read","sampling_params":{}}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	p.requireIdle(t)
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
}

// decisionRecorder keeps the last decision the router made.
type decisionRecorder struct {
	filter.Router
	last *router.Decision
}

func (r *decisionRecorder) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	d, err := r.Router.Route(ctx, req)
	r.last = d
	return d, err
}

// A body naming no model runs on the engine's base model, whatever the model header
// says (vLLM's _maybe_get_adapters: no model, no adapter): a header naming a LoRA
// adapter routes it for the adapter's base model, in the base's block namespace, not
// the adapter's, where the engine never stores its blocks.
func TestGenerateBodyWithoutModelUnderAnAdapterHeaderRunsOnTheBase(t *testing.T) {
	rec := &decisionRecorder{}
	p := newPlane(t, planeOptions{models: [][]string{{"base"}, {"base"}}, loras: []router.LoRAAdapter{{Name: "ad", BaseModel: "base"}},
		wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	ids := rollout(1, 40, 3)[0]
	resp, body := p.post(t, "/inference/v1/generate", generateBody("", ids), "x-gateway-model-name", "ad")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.NotNil(t, rec.last)
	assert.Equal(t, "base", rec.last.Model)
	assert.Empty(t, rec.last.LoRA, "the engine runs the body on its base model")

	// A body naming the adapter runs on it, as a chat does.
	resp, body = p.post(t, "/inference/v1/generate", generateBody("ad", ids), "x-gateway-model-name", "ad")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "base", rec.last.Model)
	assert.Equal(t, "ad", rec.last.LoRA)
	p.requireIdle(t)
}

// vLLM's generate does not refuse an output bound the context cannot hold beside the
// prompt (GenerateRequest.build_tok_params: no max_total_tokens, max_output_tokens
// 0); the engine stops the request at max_model_len. So a worker whose context is
// short of prompt + max_tokens stays a candidate, unlike for a completions body,
// which that engine refuses.
func TestGenerateOutputBoundPastAContextLeavesNoWorkerOut(t *testing.T) {
	rec := &decisionRecorder{}
	p := newPlane(t, planeOptions{maxModelLen: []int{100, 1000}, wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	ids := rollout(1, 40, 4)[0]
	b, _ := json.Marshal(ids)
	resp, body := p.post(t, "/inference/v1/generate", fmt.Sprintf(`{"model":"m","token_ids":%s,"sampling_params":{"max_tokens":200}}`, b))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.NotNil(t, rec.last)
	assert.False(t, rec.last.ContextNarrowed, "w0 serves it, cut at its context")

	resp, body = p.post(t, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%s,"max_tokens":200}`, b))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.True(t, rec.last.ContextNarrowed, "w0 refuses a completions body it cannot hold")
	assert.Equal(t, "w1", rec.last.Worker)
	p.requireIdle(t)
}
