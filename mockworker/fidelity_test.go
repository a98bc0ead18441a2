package mockworker

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/sim"
)

// idsPrompt is a completions prompt of the token ids from..from+n-1, as JSON.
func idsPrompt(from, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(from + i)
	}
	return "[" + strings.Join(ids, ",") + "]"
}

// completionUsage is what a test reads of a whole completion's answer.
type completionUsage struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int             `json:"prompt_tokens"`
		CompletionTokens    int             `json:"completion_tokens"`
		PromptTokensDetails json.RawMessage `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (u completionUsage) cached(t *testing.T) int {
	t.Helper()
	return detailsCached(t, u.Usage.PromptTokensDetails)
}

// detailsCached is a usage's prompt_tokens_details' cached_tokens (0 when the
// details are absent or null).
func detailsCached(t *testing.T, details json.RawMessage) int {
	t.Helper()
	var d *struct {
		CachedTokens int `json:"cached_tokens"`
	}
	if len(details) > 0 {
		require.NoError(t, json.Unmarshal(details, &d))
	}
	if d == nil {
		return 0
	}
	return d.CachedTokens
}

// postWithin posts body to url and fails the test if no answer comes within d (a
// request the engine never admits would hang forever).
func postWithin(t *testing.T, d time.Duration, url, body string) (int, string) {
	t.Helper()
	return callWithin(t, d, http.MethodPost, url, body)
}

// callWithin is postWithin with another method.
func callWithin(t *testing.T, d time.Duration, method, url, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "no answer within %v", d)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "no whole answer within %v", d)
	return resp.StatusCode, string(b)
}

// A request that names no output bound generates at most what the context leaves
// beside its prompt, as vLLM bounds it (max_model_len − prompt tokens, below any
// default), rather than the worker's default: past the context, a prompt near the KV
// cache's capacity could never be admitted and would hold the queue behind it.
func TestAnUnboundedRequestStopsAtTheContext(t *testing.T) {
	tests := []struct {
		name        string
		maxModelLen int // 0: the KV cache's 8 blocks of 16 tokens
		prompt      int
		want        int // completion tokens
	}{
		{"the default fits", 100, 50, 16},
		{"the context is reached", 100, 90, 10},
		{"the KV cache's capacity is reached", 0, 120, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 8, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1,
				MaxModelLen: tt.maxModelLen})
			require.NoError(t, err)
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(func() { srv.Close(); s.Close() })
			status, answer := postWithin(t, 10*time.Second, srv.URL+"/v1/completions", `{"model":"mock","prompt":`+idsPrompt(1, tt.prompt)+`}`)
			require.Equal(t, http.StatusOK, status, answer)
			var u completionUsage
			require.NoError(t, json.Unmarshal([]byte(answer), &u))
			assert.Equal(t, tt.want, u.Usage.CompletionTokens)
			assert.Equal(t, "length", u.Choices[0].FinishReason)
		})
	}
}

// vLLM refuses to start with a context its KV cache cannot hold (a lone request of
// max_model_len tokens must fit); a worker that took one would queue such a request
// forever.
func TestAContextPastTheKVCacheIsRefused(t *testing.T) {
	_, err := New(Config{Engine: sim.Config{NumGPUBlocks: 8, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 1, MaxModelLen: 129})
	require.ErrorContains(t, err, "max_model_len")
	_, err = New(Config{Engine: sim.Config{NumGPUBlocks: 8, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 1, MaxModelLen: 128})
	require.NoError(t, err)
}

// vLLM reports as cached_tokens every prompt token it did not compute at first
// scheduling: its own prefix cache's and a KV connector's (num_cached_tokens is
// num_computed_tokens, local plus external, vllm/v1/core/sched/scheduler.py). A decode
// worker that read the prompt's KV from a prefill worker reports all of it but the last
// token; one that loaded blocks from its host tier reports them with its device hits.
func TestCachedTokensCountWhatAConnectorLoaded(t *testing.T) {
	t.Run("a remote prefill", func(t *testing.T) {
		decode, decodeAddr := worker(t, "d0", false, nil)
		resp, body := post(t, decodeAddr, "/v1/completions",
			`{"model":"mock","prompt":`+idsPrompt(1, 100)+`,"max_tokens":2,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p0"}}`, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		var u completionUsage
		require.NoError(t, json.Unmarshal([]byte(body), &u))
		transferred, _ := engineCounts(decode)
		require.Equal(t, 99, transferred)
		assert.Equal(t, 99, u.cached(t), "the transferred tokens are cached tokens")
	})
	t.Run("a host tier", func(t *testing.T) {
		// 16 device blocks of 16 tokens: three prompts of 7 blocks each evict the first
		// from the device; the host tier keeps it.
		s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 16, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048, HostBlocks: 64},
			Speed: 100, Seed: 1})
		require.NoError(t, err)
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(func() { srv.Close(); s.Close() })
		var u completionUsage
		for _, from := range []int{1, 1001, 2001, 1} {
			status, body := postWithin(t, 10*time.Second, srv.URL+"/v1/completions", `{"model":"mock","prompt":`+idsPrompt(from, 112)+`,"max_tokens":1}`)
			require.Equal(t, http.StatusOK, status, body)
			u = completionUsage{}
			require.NoError(t, json.Unmarshal([]byte(body), &u))
		}
		require.Positive(t, s.HostTokens(), "the last prompt was loaded from the host tier")
		assert.Equal(t, 96, u.cached(t), "its six whole blocks but the last token's are cached tokens, from wherever they were loaded")
	})
}

// vLLM's completions stream is made of text_completion objects, its usage chunk too
// (CompletionStreamResponse); only chat chunks are chat.completion.chunk.
func TestStreamChunksNameVLLMsObjects(t *testing.T) {
	_, addr := worker(t, "w0", false, nil)
	for path, want := range map[string]string{"/v1/completions": "text_completion", "/v1/chat/completions": "chat.completion.chunk"} {
		body := `{"model":"mock","prompt":"hello there","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
		if path == "/v1/chat/completions" {
			body = `{"model":"mock","messages":[{"role":"user","content":"hello there"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
		}
		resp, answer := post(t, addr, path, body, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, answer)
		events, usage := 0, 0
		lines := bufio.NewScanner(strings.NewReader(answer))
		for lines.Scan() {
			data, ok := strings.CutPrefix(lines.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var chunk struct {
				Object string          `json:"object"`
				Usage  json.RawMessage `json:"usage"`
			}
			require.NoError(t, json.Unmarshal([]byte(data), &chunk), data)
			assert.Equal(t, want, chunk.Object, "%s: %s", path, data)
			events++
			if len(chunk.Usage) > 0 {
				usage++
			}
		}
		assert.Equal(t, 4, events, path)
		assert.Equal(t, 1, usage, path)
	}
}

// vLLM (with --enable-prompt-tokens-details) writes prompt_tokens_details only when
// some prompt tokens were cached: a whole answer has it null otherwise, a stream's
// usage chunk leaves it out (exclude_none).
func TestPromptTokensDetailsOnlyWithCachedTokens(t *testing.T) {
	_, addr := worker(t, "w0", false, nil)
	prompt := idsPrompt(1, 40)
	for i, tt := range []struct {
		stream bool
		want   string // the usage's prompt_tokens_details, "" when absent
	}{{false, "null"}, {true, `{"cached_tokens":32}`}, {false, `{"cached_tokens":32}`}} {
		body := `{"model":"mock","prompt":` + prompt + `,"max_tokens":1}`
		if tt.stream {
			body = `{"model":"mock","prompt":` + prompt + `,"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`
		}
		resp, answer := post(t, addr, "/v1/completions", body, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, answer)
		if tt.stream {
			_, answer, _ = strings.Cut(answer, `"choices":[],`)
			answer, _, _ = strings.Cut("{"+answer, "\n")
		}
		var u struct {
			Usage map[string]json.RawMessage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(answer), &u), answer)
		assert.Equal(t, tt.want, string(u.Usage["prompt_tokens_details"]), "request %d: %s", i, answer)
	}
	// A first stream, nothing cached.
	_, answer := post(t, addr, "/v1/completions", `{"model":"mock","prompt":`+idsPrompt(1000, 40)+`,"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`, nil)
	assert.Contains(t, answer, `"usage":{"completion_tokens":1,"prompt_tokens":40,"total_tokens":41}}`)
}

// vLLM's errors are its ErrorResponse: type BadRequestError and code 400 for a 400
// (create_error_response), as for a prompt past the context.
func TestErrorsAreVLLMsErrorResponse(t *testing.T) {
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}, Speed: 100, Seed: 1,
		MaxModelLen: 100})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	for _, path := range []string{"/v1/completions", "/v1/responses"} {
		body := `{"model":"mock","prompt":` + idsPrompt(1, 100) + `}`
		if path == "/v1/responses" {
			body = `{"model":"mock","store":false,"input":"hi","max_output_tokens":200}`
		}
		status, answer := postWithin(t, 10*time.Second, srv.URL+path, body)
		require.Equal(t, http.StatusBadRequest, status, answer)
		var e struct {
			Error map[string]any `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
		assert.Equal(t, "BadRequestError", e.Error["type"], answer)
		assert.Equal(t, 400.0, e.Error["code"], answer)
		assert.Contains(t, e.Error, "param")
		assert.Contains(t, e.Error["message"], "This model's maximum context length is 100 tokens.")
	}
}

// vLLM's counters are prometheus_client Counters: their samples are named with _total
// (vllm:prefix_cache_queries_total), which is what a query of vLLM's metrics names.
func TestPrefixCacheCountersAreNamedAsVLLMExportsThem(t *testing.T) {
	_, addr := worker(t, "w0", false, nil)
	for range 2 {
		resp, body := post(t, addr, "/v1/completions", `{"model":"mock","prompt":`+idsPrompt(1, 40)+`,"max_tokens":1}`, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
	}
	assert.Equal(t, 80.0, metric(t, addr, "vllm:prefix_cache_queries_total"))
	assert.Equal(t, 32.0, metric(t, addr, "vllm:prefix_cache_hits_total"))
}
