package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize/models"
)

// generateReply is what these tests read of a /inference/v1/generate response.
type generateReply struct {
	servedBy string
	output   []uint32 // the first choice's token ids
	prompt   int64
	cached   int64
}

// postJSON posts body as JSON to url, requires a 200 and decodes the answer into out;
// it returns the worker that served it.
func postJSON(t *testing.T, client *http.Client, url string, body, out any) (servedBy string) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := client.Post(url, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", answer)
	require.NoError(t, json.Unmarshal(answer, out), "%s", answer)
	return resp.Header.Get("x-served-by")
}

// postGenerate sends a generate body for ids (model "qwen") to baseURL and reads the
// reply.
func postGenerate(t *testing.T, client *http.Client, baseURL string, ids []uint32) generateReply {
	t.Helper()
	var out struct {
		Choices []struct {
			TokenIDs []uint32 `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int64 `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	servedBy := postJSON(t, client, baseURL+"/inference/v1/generate",
		map[string]any{"model": "qwen", "token_ids": ids, "sampling_params": map[string]any{"max_tokens": 4}}, &out)
	require.NotEmpty(t, out.Choices)
	r := generateReply{servedBy: servedBy, output: out.Choices[0].TokenIDs, prompt: out.Usage.PromptTokens}
	if d := out.Usage.PromptTokensDetails; d != nil {
		r.cached = d.CachedTokens
	}
	return r
}

// observation is an RL environment's reply in a rollout: n token ids particular to
// episode and turn.
func observation(episode, turn, n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(100_000*(episode+1) + 1_000*turn + i + 1)
	}
	return ids
}

// TestGenerateRolloutsStayOnTheEngineHoldingThem: RL episodes on vLLM's token-in API,
// each turn's token_ids the previous turn's prompt, the engine's output ids and a new
// observation, as a rollout framework sends them. Each episode's first turn goes to a
// worker directly, past kvroute, so kvroute learns where it is from that engine's KV
// events alone; the later turns, through the data plane and kvroute, go to that
// engine, which serves the whole earlier prompt from its cache (its full blocks).
func TestGenerateRolloutsStayOnTheEngineHoldingThem(t *testing.T) {
	workers := startEventWorkers(t, 3, nil)
	a, grpcAddr := serveBuilt(t, eventsConfig(workers))
	envoy := dataPlane(t, grpcAddr)
	direct := &http.Client{Timeout: 20 * time.Second}

	const turns = 4
	for episode, w := range workers {
		require.Eventually(t, w.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
		prompt := observation(episode, 0, 150)
		first := postGenerate(t, direct, w.http.URL, prompt)
		require.Equal(t, w.name, first.servedBy)
		p, err := router.Prompter{BlockSize: 16, Tokenizers: a.tokenizers}.Prompt(context.Background(), &router.Request{Model: "qwen", Tokens: prompt})
		require.NoError(t, err)
		waitIndexed(t, a, w.name, p.Blocks, len(p.Blocks))

		for turn := 1; turn < turns; turn++ {
			previous := int64(len(prompt))
			prompt = append(append(prompt, first.output...), observation(episode, turn, 40)...)
			got := postGenerate(t, envoy.Client(), envoy.URL, prompt)
			assert.Equal(t, w.name, got.servedBy, "episode %d turn %d goes to the engine holding the episode", episode, turn)
			assert.Equal(t, int64(len(prompt)), got.prompt)
			assert.GreaterOrEqual(t, got.cached, previous/16*16, "episode %d turn %d: the earlier prompt's full blocks come from the cache", episode, turn)
			first = got
		}
	}
	assert.Equal(t, float64(len(workers)*(turns-1)), metricValue(t, a, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
}

// TestGenerateBodiesRoutedByLoadWhenUnread: with generate_paths empty the same turns are
// routed by load at their headers, and the engines see the bodies unchanged.
func TestGenerateBodiesRoutedByLoadWhenUnread(t *testing.T) {
	workers := startEventWorkers(t, 2, nil)
	cfg := eventsConfig(workers)
	cfg.Filter.GeneratePaths = nil
	a, grpcAddr := serveBuilt(t, cfg)
	envoy := dataPlane(t, grpcAddr)
	for i := range 4 {
		got := postGenerate(t, envoy.Client(), envoy.URL, observation(i, 0, 20))
		assert.NotEmpty(t, got.servedBy, fmt.Sprint("request ", i))
	}
	assert.Equal(t, 4.0, metricValue(t, a, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
}

// postSGLang sends an SGLang /generate body to baseURL and reads the answer: the
// worker, the output ids and meta_info's prompt and cached tokens.
func postSGLang(t *testing.T, client *http.Client, baseURL string, body map[string]any) generateReply {
	t.Helper()
	var answer struct {
		OutputIDs []uint32 `json:"output_ids"`
		MetaInfo  struct {
			PromptTokens int64 `json:"prompt_tokens"`
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"meta_info"`
	}
	servedBy := postJSON(t, client, baseURL+"/generate", body, &answer)
	return generateReply{servedBy: servedBy, output: answer.OutputIDs, prompt: answer.MetaInfo.PromptTokens, cached: answer.MetaInfo.CachedTokens}
}

// TestSGLangRolloutsStayOnTheEngineHoldingThem: SGLang's native /generate, its body
// naming no model (default_model names it), in input_ids and in text. Each episode's
// first turn goes to a worker directly, past kvroute; its later turns, through the data
// plane and kvroute with KV events on, go to that engine, which serves the earlier
// prompt's full blocks from cache; kvroute reads the answers' meta_info as their usage.
func TestSGLangRolloutsStayOnTheEngineHoldingThem(t *testing.T) {
	// The engines encode text with the embedded Qwen3 tokenizer, loaded apart from
	// kvroute's (which has no tokenizers configured: its embedded default).
	engineTokenizers, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	workers := startEventWorkers(t, 3, engineTokenizers)
	cfg := eventsConfig(workers)
	cfg.Filter.DefaultModel = "qwen"
	a, grpcAddr := serveBuilt(t, cfg)
	envoy := dataPlane(t, grpcAddr)
	direct := &http.Client{Timeout: 20 * time.Second}

	const turns = 3
	var reportedCached int64
	for episode, w := range workers {
		require.Eventually(t, w.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
		text := episode%2 == 1 // episodes 0 and 2 in input_ids, 1 in text
		body := func(ids []uint32, words string) map[string]any {
			if text {
				return map[string]any{"text": words, "sampling_params": map[string]any{"max_new_tokens": 4}}
			}
			return map[string]any{"input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 4}}
		}
		ids := observation(episode, 0, 150)
		words := fmt.Sprintf("Episode %d. ", episode) + strings.Repeat("The environment reports a long observation. ", 30)
		first := postSGLang(t, direct, w.http.URL, body(ids, words))
		require.Equal(t, w.name, first.servedBy)
		var p router.Prompt
		if text {
			p, err = router.Prompter{BlockSize: 16, Tokenizers: a.tokenizers}.Prompt(context.Background(), &router.Request{Model: "qwen", Prompt: words})
		} else {
			p, err = router.Prompter{BlockSize: 16, Tokenizers: a.tokenizers}.Prompt(context.Background(), &router.Request{Model: "qwen", Tokens: ids})
		}
		require.NoError(t, err)
		waitIndexed(t, a, w.name, p.Blocks, len(p.Blocks))

		for turn := 1; turn < turns; turn++ {
			previous := first.prompt
			ids = append(append(ids, first.output...), observation(episode, turn, 40)...)
			words += fmt.Sprintf(" Turn %d: the agent acts and the environment answers.", turn)
			got := postSGLang(t, envoy.Client(), envoy.URL, body(ids, words))
			assert.Equal(t, w.name, got.servedBy, "episode %d turn %d goes to the engine holding the episode", episode, turn)
			assert.GreaterOrEqual(t, got.cached, previous/16*16-16, "episode %d turn %d: the earlier prompt's full blocks come from the cache", episode, turn)
			reportedCached += got.cached
			first = got
		}
	}
	assert.Equal(t, float64(len(workers)*(turns-1)), metricValue(t, a, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"}))
	assert.Equal(t, float64(reportedCached), metricValue(t, a, "kvroute_filter_reported_cached_tokens_total", nil), "meta_info read as the usage")
}

// TestSGLangSessionsStayOnTheEngineThatOpenedThem: SGLang's sessions, through the data
// plane and the built server. Each /open_session goes by load; kvroute reads the id the
// engine answers, and sends every turn naming the session (session_params.id, each
// continuing the previous turn by its rid) and the /close_session to that engine,
// which rebuilds each turn's prompt from the session's history and serves that history
// from its cache. A turn after the close reaches the same engine, which no longer holds
// the session.
func TestSGLangSessionsStayOnTheEngineThatOpenedThem(t *testing.T) {
	workers := startEventWorkers(t, 3, nil)
	cfg := eventsConfig(workers)
	cfg.Filter.DefaultModel = "qwen"
	a, grpcAddr := serveBuilt(t, cfg)
	envoy := dataPlane(t, grpcAddr)

	const sessions, turns = 3, 4
	for s := range sessions {
		var id string
		holder := postJSON(t, envoy.Client(), envoy.URL+"/open_session", map[string]any{"capacity_of_str_len": 100_000}, &id)
		require.NotEmpty(t, id)
		rid, history := "", int64(0)
		for turn := range turns {
			params := map[string]any{"id": id}
			if rid != "" {
				params["rid"] = rid
			}
			var answer struct {
				OutputIDs []uint32 `json:"output_ids"`
				MetaInfo  struct {
					ID           string `json:"id"`
					PromptTokens int64  `json:"prompt_tokens"`
					CachedTokens int64  `json:"cached_tokens"`
				} `json:"meta_info"`
			}
			servedBy := postJSON(t, envoy.Client(), envoy.URL+"/generate", map[string]any{
				"input_ids": observation(s, turn, 40), "session_params": params, "sampling_params": map[string]any{"max_new_tokens": 4},
			}, &answer)
			assert.Equal(t, holder, servedBy, "session %d turn %d", s, turn)
			assert.Equal(t, history+40, answer.MetaInfo.PromptTokens, "session %d turn %d: the engine's prompt is the session's history and the turn", s, turn)
			assert.GreaterOrEqual(t, answer.MetaInfo.CachedTokens, history/16*16-16, "session %d turn %d: the history comes from the cache", s, turn)
			rid, history = answer.MetaInfo.ID, answer.MetaInfo.PromptTokens+int64(len(answer.OutputIDs))
		}
		resp, err := envoy.Client().Post(envoy.URL+"/close_session", "application/json", strings.NewReader(fmt.Sprintf(`{"session_id":%q}`, id)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, holder, resp.Header.Get("x-served-by"), "session %d: closed where it was open", s)
		resp, err = envoy.Client().Post(envoy.URL+"/generate", "application/json", strings.NewReader(fmt.Sprintf(`{"input_ids":[1,2,3],"session_params":{"id":%q}}`, id)))
		require.NoError(t, err)
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", answer)
		assert.Contains(t, string(answer), "does not exist")
		assert.Equal(t, holder, resp.Header.Get("x-served-by"))
	}
	assert.Equal(t, float64(sessions*(turns+2)), metricValue(t, a, "kvroute_router_sglang_session_requests_total", map[string]string{"routed": "stored_worker"}))
	assert.Zero(t, metricValue(t, a, "kvroute_router_sglang_session_requests_total", map[string]string{"routed": "unknown"}))
}
