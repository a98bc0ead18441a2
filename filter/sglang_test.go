package filter_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// sglangText and sglangIDs are bodies of SGLang's native POST /generate.
func sglangText(text string) string {
	return fmt.Sprintf(`{"text":%q,"sampling_params":{"max_new_tokens":16,"temperature":0}}`, text)
}

func sglangIDs(ids []int) string {
	b, _ := json.Marshal(ids)
	return fmt.Sprintf(`{"input_ids":%s,"sampling_params":{"max_new_tokens":16}}`, b)
}

func TestSGLangGenerateReturnsToItsHolder(t *testing.T) {
	system := strings.Repeat("Stable instructions for the agent. ", 30)
	turns := rollout(3, 200, 5)
	for _, tt := range []struct {
		name    string
		bodies  []string
		headers []string
		cfg     func(*filter.Config)
	}{
		{"text, the model from default_model", []string{sglangText(system + "turn one"), sglangText(system + "turn one, answer, turn two")}, nil,
			func(c *filter.Config) { c.DefaultModel = "m" }},
		{"input_ids, the model from the model header", []string{sglangIDs(turns[0]), sglangIDs(turns[1]), sglangIDs(turns[2])}, []string{"x-gateway-model-name", "m"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{models: [][]string{{"m"}, {"m"}}, filterCfg: tt.cfg})
			first, body := p.post(t, "/generate", tt.bodies[0], tt.headers...)
			require.Equal(t, http.StatusOK, first.StatusCode, body)
			holder := first.Header.Get("x-served-by")
			release := p.book(t, holder, 0, 3)
			for _, b := range tt.bodies[1:] {
				resp, body := p.post(t, "/generate", b, tt.headers...)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				assert.Equal(t, holder, resp.Header.Get("x-served-by"))
			}
			release()
			p.requireIdle(t)
			assert.Equal(t, float64(len(tt.bodies)), p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
		})
	}
}

// An SGLang body is SGLang's to judge: kvroute routes by load what it does not read
// (no model to route for, a prompt it does not compute, fields of another type), and
// refuses only what is not a JSON object.
func TestSGLangGenerateBodiesKvrouteDoesNotReadGoByLoad(t *testing.T) {
	p := newPlane(t, planeOptions{filterCfg: func(c *filter.Config) { c.DefaultModel = "m" }})
	for _, body := range []string{
		`{"input_embeds":[[0.1]]}`,
		`{"text":"t","image_data":"http://x/cat.png"}`,
		`{"input_ids":[]}`,
		`{"text":7}`,
		`{"prompt":"vLLM's old demo server's /generate body"}`,
	} {
		resp, out := p.post(t, "/generate", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", body, out)
	}
	resp, out := p.post(t, "/generate", `{"text":`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, out)
	p.requireIdle(t)
	assert.Equal(t, 5.0, p.counter(t, "kvroute_router_prompt_fallbacks_total", map[string]string{"reason": "unsupported_content"}))

	// Without default_model or a model header, a body is routed by load.
	q := newPlane(t, planeOptions{})
	resp, out = q.post(t, "/generate", sglangText("hello"))
	require.Equal(t, http.StatusOK, resp.StatusCode, out)
	assert.Equal(t, 1.0, q.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
}

// llm-d's routing sidecar passes SGLang's /generate to the decode engine whole: in a
// fleet with prefill workers such a request is never split (no prefill header, nothing
// booked on a prefill worker), while vLLM's generate, which the sidecar splits, is.
func TestSGLangGenerateIsNeverSplit(t *testing.T) {
	rec := &decisionRecorder{}
	p := newPlane(t, planeOptions{workers: 2, roles: []string{router.RoleDecode, router.RolePrefill}, params: scoring.DefaultParams(),
		filterCfg:  func(c *filter.Config) { c.DefaultModel = "m" },
		wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	ids := rollout(1, 200, 6)[0]
	resp, body := p.post(t, "/generate", sglangIDs(ids), "x-prefiller-host-port", "10.9.9.9:80")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.NotNil(t, rec.last)
	assert.Nil(t, rec.last.Prefill)
	assert.Equal(t, router.DecodeOnlyWholeAPI, rec.last.DecodeOnly)
	served := p.workers[0].Served()
	require.Len(t, served, 1)
	assert.Empty(t, served[0].Header.Get("x-prefiller-host-port"), "the client's prefill header is removed too")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_disaggregation_total", map[string]string{"outcome": "whole_api"}))

	resp, body = p.post(t, "/inference/v1/generate", generateBody("m", rollout(1, 200, 7)[0]))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.NotNil(t, rec.last.Prefill, "vLLM's generate is split")
	p.waitIdle(t)
}

func TestDefaultModelIsValidated(t *testing.T) {
	cfg := filter.DefaultConfig()
	cfg.DefaultModel = "bad\nmodel"
	assert.ErrorContains(t, cfg.Validate(), "default_model")
	cfg.DefaultModel = "Qwen/Qwen3-8B"
	assert.NoError(t, cfg.Validate())
}

// SGLang checks prompt + max_new_tokens against its context only for a bound the body
// gives (_validate_one_request reads sampling_params.get("max_new_tokens")); without
// one the scheduler trims its default 128 to the context. So a worker whose context
// cannot hold the prompt and 128 more stays a candidate, unless the body asks for more
// than it holds.
func TestSGLangGenerateDefaultBoundLeavesNoWorkerOut(t *testing.T) {
	rec := &decisionRecorder{}
	p := newPlane(t, planeOptions{maxModelLen: []int{100, 1000}, filterCfg: func(c *filter.Config) { c.DefaultModel = "m" },
		wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	ids, _ := json.Marshal(rollout(1, 40, 8)[0])
	resp, body := p.post(t, "/generate", fmt.Sprintf(`{"input_ids":%s}`, ids))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.NotNil(t, rec.last)
	assert.False(t, rec.last.ContextNarrowed, "SGLang serves it on w0, its output trimmed to the context")

	resp, body = p.post(t, "/generate", fmt.Sprintf(`{"input_ids":%s,"sampling_params":{"max_new_tokens":128}}`, ids))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.True(t, rec.last.ContextNarrowed, "w0 refuses a bound it cannot hold")
	assert.Equal(t, "w1", rec.last.Worker)
	p.requireIdle(t)
}

// An SGLang body names its adapter in lora_path, apart from the model: a model header
// (or default_model) naming a LoRA adapter still routes for that adapter's base, the
// body's lora_path salting the blocks, as for a body without lora_path.
func TestSGLangGenerateLoRAPathUnderAnAdapterModelRoutesForTheBase(t *testing.T) {
	rec := &decisionRecorder{}
	p := newPlane(t, planeOptions{models: [][]string{{"base"}, {"base"}},
		loras:      []router.LoRAAdapter{{Name: "ad", BaseModel: "base"}, {Name: "other", BaseModel: "base"}},
		wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
	ids, _ := json.Marshal(rollout(1, 40, 9)[0])
	for _, h := range []string{"ad", "base"} {
		resp, body := p.post(t, "/generate", fmt.Sprintf(`{"input_ids":%s,"lora_path":"other"}`, ids), "x-gateway-model-name", h)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.NotNil(t, rec.last)
		assert.Equal(t, "base", rec.last.Model, "header %s", h)
		assert.Equal(t, "other", rec.last.LoRA, "header %s", h)
		assert.False(t, rec.last.ModelUnlisted, "header %s", h)
	}
	p.requireIdle(t)
}
