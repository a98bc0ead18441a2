package mockworker

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/sim"
)

// generateWorker starts a worker of cfg (its engine and speed filled in when unset)
// and returns its URL.
func generateWorker(t *testing.T, cfg Config) string {
	t.Helper()
	if cfg.Engine.NumGPUBlocks == 0 {
		cfg.Engine = sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}
	}
	cfg.Name, cfg.Speed, cfg.Seed = "w0", 100, 1
	s, err := New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	return srv.URL
}

// generateAnswer is what a test reads of a whole generate answer or of one streamed
// chunk.
type generateAnswer struct {
	RequestID string `json:"request_id"`
	Model     string `json:"model"`
	Choices   []struct {
		Index        int      `json:"index"`
		FinishReason *string  `json:"finish_reason"`
		TokenIDs     []uint32 `json:"token_ids"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int             `json:"prompt_tokens"`
		CompletionTokens    int             `json:"completion_tokens"`
		TotalTokens         int             `json:"total_tokens"`
		PromptTokensDetails json.RawMessage `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// generated reads a generate answer, whole or streamed (its chunks' token ids joined,
// the usage chunk's usage), and its chunks (nil for a whole answer).
func generated(t *testing.T, body string, stream bool) (generateAnswer, []generateAnswer) {
	t.Helper()
	if !stream {
		var a generateAnswer
		require.NoError(t, json.Unmarshal([]byte(body), &a), body)
		return a, nil
	}
	var all generateAnswer
	var chunks []generateAnswer
	for _, data := range sseData(t, body) {
		var c generateAnswer
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		chunks = append(chunks, c)
		all.RequestID = c.RequestID
		if len(c.Choices) == 0 {
			all.Usage = c.Usage
			continue
		}
		if len(all.Choices) == 0 {
			first := c.Choices[0]
			first.TokenIDs = append([]uint32(nil), first.TokenIDs...)
			all.Choices = append(all.Choices, first)
			continue
		}
		all.Choices[0].TokenIDs = append(all.Choices[0].TokenIDs, c.Choices[0].TokenIDs...)
		all.Choices[0].FinishReason = c.Choices[0].FinishReason
	}
	return all, chunks
}

// cachedOf is an answer's usage.prompt_tokens_details.cached_tokens (0 without details).
func cachedOf(t *testing.T, a generateAnswer) int {
	t.Helper()
	require.NotNil(t, a.Usage)
	return detailsCached(t, a.Usage.PromptTokensDetails)
}

// A generate request's prompt is its token ids, run through the engine as a
// completion's token-id prompt is: a second identical prompt finds its full blocks in
// the prefix cache and reports them as cached_tokens, whole or streamed (with
// include_usage), and a completion of the same ids hits the same blocks.
func TestGenerateHitsThePrefixCache(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
	}{{"whole", false}, {"streamed", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := generateWorker(t, Config{})
			body := `{"token_ids":` + idsPrompt(1, 40) + `,"sampling_params":{"max_tokens":3,"temperature":0}`
			if tt.stream {
				body += `,"stream":true,"stream_options":{"include_usage":true}`
			}
			body += `}`
			for turn, want := range []int{0, 32} {
				status, answer := postWithin(t, 10*time.Second, url+generatePath, body)
				require.Equal(t, http.StatusOK, status, answer)
				a, _ := generated(t, answer, tt.stream)
				assert.Equal(t, 40, a.Usage.PromptTokens)
				assert.Equal(t, 3, a.Usage.CompletionTokens)
				assert.Equal(t, want, cachedOf(t, a), "turn %d: the full blocks of the prompt", turn)
			}
			status, answer := postWithin(t, 10*time.Second, url+"/v1/completions", `{"model":"mock","prompt":`+idsPrompt(1, 40)+`,"max_tokens":1}`)
			require.Equal(t, http.StatusOK, status, answer)
			var u completionUsage
			require.NoError(t, json.Unmarshal([]byte(answer), &u))
			assert.Equal(t, 32, u.cached(t), "a completion of the same ids shares the blocks")
		})
	}
}

// Without sampling_params.max_tokens the output is fitted to the context, as vLLM's
// serve_tokens has get_max_tokens do (the worker's default at most, max_model_len −
// the prompt); a max_tokens past the context is cut short at it rather than refused,
// since generate checks no output bound and the engine stops a request at
// max_model_len; a prompt of the whole context gets vLLM's 400.
func TestGenerateFitsTheOutputToTheContext(t *testing.T) {
	tests := []struct {
		name      string
		prompt    int
		maxTokens string // sampling_params.max_tokens, "" for none
		want      int    // completion tokens; 0: refused
	}{
		{"the default fits", 50, "", 16},
		{"the context is reached", 90, "", 10},
		{"max_tokens", 50, "5", 5},
		{"max_tokens null is none", 95, "null", 5},
		{"max_tokens past the context", 90, "30", 10},
		{"a prompt of the whole context", 100, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := generateWorker(t, Config{MaxModelLen: 100})
			params := `{}`
			if tt.maxTokens != "" {
				params = `{"max_tokens":` + tt.maxTokens + `}`
			}
			status, answer := postWithin(t, 10*time.Second, url+generatePath, `{"token_ids":`+idsPrompt(1, tt.prompt)+`,"sampling_params":`+params+`}`)
			if tt.want == 0 {
				assert.Equal(t, http.StatusBadRequest, status, answer)
				assert.Contains(t, answer, "maximum context length is 100 tokens")
				return
			}
			require.Equal(t, http.StatusOK, status, answer)
			a, _ := generated(t, answer, false)
			assert.Equal(t, tt.want, a.Usage.CompletionTokens)
			require.Len(t, a.Choices, 1)
			assert.Len(t, a.Choices[0].TokenIDs, tt.want)
			assert.Equal(t, "length", *a.Choices[0].FinishReason)
		})
	}
}

// The answer is vLLM's GenerateResponse, or GenerateStreamResponse chunks: the new
// token ids of each event with finish_reason on the last, usage null in each unless
// stream_options.continuous_usage_stats asks for it, then with include_usage a chunk of
// no choices and the usage, then [DONE]. The request id is generate-tokens- and the
// x-request-id header or the body's request_id.
func TestGenerateAnswersInVLLMsShapes(t *testing.T) {
	url := generateWorker(t, Config{ServedModels: []string{"qwen"}})
	const prompt = `"token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]`

	status, answer := postWithin(t, 10*time.Second, url+generatePath, `{`+prompt+`,"request_id":"r1","sampling_params":{"max_tokens":4}}`)
	require.Equal(t, http.StatusOK, status, answer)
	var whole map[string]any
	require.NoError(t, json.Unmarshal([]byte(answer), &whole))
	for _, key := range []string{"request_id", "model", "created", "choices", "usage", "prompt_logprobs", "kv_transfer_params"} {
		assert.Contains(t, whole, key)
	}
	assert.Equal(t, "generate-tokens-r1", whole["request_id"])
	assert.Equal(t, "qwen", whole["model"], "no model: the served one")
	assert.Nil(t, whole["kv_transfer_params"])
	choice := whole["choices"].([]any)[0].(map[string]any)
	assert.Equal(t, map[string]any{"index": 0.0, "logprobs": nil, "finish_reason": "length", "token_ids": choice["token_ids"], "routed_experts": nil}, choice)
	assert.Len(t, choice["token_ids"], 4)
	assert.Equal(t, map[string]any{"prompt_tokens": 18.0, "completion_tokens": 4.0, "total_tokens": 22.0, "prompt_tokens_details": nil}, whole["usage"])

	tests := []struct {
		name, options string
		usage         bool // a usage chunk
		continuous    bool // usage in every chunk
	}{
		{"no usage", ``, false, false},
		{"include_usage", `,"stream_options":{"include_usage":true}`, true, false},
		{"continuous_usage_stats", `,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, url+generatePath, strings.NewReader(`{`+prompt+`,"model":"qwen","stream":true,"sampling_params":{"max_tokens":4}`+tt.options+`}`))
			require.NoError(t, err)
			req.Header.Set("x-request-id", "hdr")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("content-type"))
			all, chunks := generated(t, string(b), true)
			assert.Equal(t, "generate-tokens-hdr", all.RequestID)
			require.Len(t, all.Choices, 1)
			assert.Len(t, all.Choices[0].TokenIDs, 4)
			assert.Equal(t, "length", *all.Choices[0].FinishReason)
			tokens := 0
			for i, c := range chunks {
				if len(c.Choices) == 0 {
					require.True(t, tt.usage, "a usage chunk only with include_usage")
					require.Equal(t, len(chunks)-1, i, "the usage chunk is the last")
					assert.Equal(t, 4, c.Usage.CompletionTokens)
					assert.Equal(t, 22, c.Usage.TotalTokens)
					lines := strings.Split(strings.TrimSuffix(string(b), "\n\ndata: [DONE]\n\n"), "\n\n")
					assert.NotContains(t, lines[len(lines)-1], "null", "dumped with exclude_none")
					continue
				}
				tokens += len(c.Choices[0].TokenIDs)
				if tt.continuous {
					require.NotNil(t, c.Usage)
					assert.Equal(t, tokens, c.Usage.CompletionTokens, "the tokens so far")
				} else {
					assert.Nil(t, c.Usage)
				}
				if i < len(chunks)-1 && len(chunks[i+1].Choices) > 0 {
					assert.Nil(t, c.Choices[0].FinishReason, "only the last token's chunk finishes")
				}
			}
			assert.Equal(t, tt.usage, all.Usage != nil)
		})
	}
}

// A body vLLM's pydantic model refuses gets its validation 400 (type "Bad Request",
// the field's loc as param); a model the worker does not serve gets vLLM's 404; an
// adapter is served under its own name.
func TestGenerateRefusesWhatVLLMRefuses(t *testing.T) {
	url := generateWorker(t, Config{ServedModels: []string{"qwen"}, LoRAAdapters: map[string]string{"sql": "qwen"}})
	tests := []struct {
		name, body string
		status     int
		param      string // the error's param; "" for a 200
		model      string // the answer's model, for a 200
	}{
		{"no token_ids", `{"sampling_params":{}}`, 400, "body.token_ids", ""},
		{"token_ids null", `{"token_ids":null,"sampling_params":{}}`, 400, "body.token_ids", ""},
		{"token_ids a string", `{"token_ids":"1 2 3","sampling_params":{}}`, 400, "body.token_ids", ""},
		{"token_ids empty", `{"token_ids":[],"sampling_params":{}}`, 400, "body.token_ids", ""},
		{"a negative token id", `{"token_ids":[1,-2],"sampling_params":{}}`, 400, "body.token_ids", ""},
		{"no sampling_params", `{"token_ids":[1,2,3]}`, 400, "body.sampling_params", ""},
		{"sampling_params a list", `{"token_ids":[1,2,3],"sampling_params":[1]}`, 400, "body.sampling_params", ""},
		{"max_tokens 0", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":0}}`, 400, "body.sampling_params", ""},
		{"max_tokens a string", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":"5"}}`, 400, "body.sampling_params.max_tokens", ""},
		{"stream a string", `{"token_ids":[1,2,3],"sampling_params":{},"stream":"yes please"}`, 400, "body.stream", ""},
		{"not an object", `[1,2,3]`, 400, "body", ""},
		{"an unknown model", `{"token_ids":[1,2,3],"sampling_params":{},"model":"llama"}`, 404, "model", ""},
		{"the served model", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1},"model":"qwen"}`, 200, "", "qwen"},
		{"model null", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1},"model":null}`, 200, "", "qwen"},
		{"an adapter", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1},"model":"sql"}`, 200, "", "sql"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, answer := postWithin(t, 10*time.Second, url+generatePath, tt.body)
			require.Equal(t, tt.status, status, answer)
			if tt.status == http.StatusOK {
				a, _ := generated(t, answer, false)
				assert.Equal(t, tt.model, a.Model)
				return
			}
			var e struct {
				Error struct {
					Message, Type, Param string
					Code                 int
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
			assert.Equal(t, tt.param, e.Error.Param)
			assert.Equal(t, tt.status, e.Error.Code)
			if tt.status == http.StatusNotFound {
				assert.Equal(t, "NotFoundError", e.Error.Type)
				assert.Equal(t, "The model `llama` does not exist.", e.Error.Message)
			} else {
				assert.Equal(t, "Bad Request", e.Error.Type)
				assert.Contains(t, e.Error.Message, "1 validation error:")
			}
		})
	}
}

// cache_salt puts a request's blocks in a namespace of their own, as vLLM folds it
// into the first block's hash: a prompt is cached only for requests of the same salt
// (a generate's or a completion's alike),
// and the first block's BlockStored event carries the salt in its extra keys (the one
// kvroute reads it from) while the blocks after it carry none.
func TestGenerateCacheSaltSeparatesTheCache(t *testing.T) {
	url, sub := eventsWorker(t, sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048})

	turns := []struct {
		salt string // "" for none
		want int    // cached tokens
	}{{"", 0}, {"alice", 0}, {"alice", 32}, {"bob", 0}, {"", 32}}
	for i, turn := range turns {
		salt := ""
		if turn.salt != "" {
			salt = `,"cache_salt":"` + turn.salt + `"`
		}
		status, answer := postWithin(t, 10*time.Second, url+generatePath, `{"token_ids":`+idsPrompt(1, 40)+`,"sampling_params":{"max_tokens":1}`+salt+`}`)
		require.Equal(t, http.StatusOK, status, answer)
		a, _ := generated(t, answer, false)
		assert.Equal(t, turn.want, cachedOf(t, a), "turn %d, salt %q", i, turn.salt)
	}

	// A completion's cache_salt is the same namespace.
	for salt, want := range map[string]int{"alice": 32, "carol": 0} {
		status, answer := postWithin(t, 10*time.Second, url+"/v1/completions", `{"model":"mock","prompt":`+idsPrompt(1, 40)+`,"max_tokens":1,"cache_salt":"`+salt+`"}`)
		require.Equal(t, http.StatusOK, status, answer)
		var u completionUsage
		require.NoError(t, json.Unmarshal([]byte(answer), &u))
		assert.Equal(t, want, u.cached(t), "a completion salted %q", salt)
	}

	// The first three requests to compute the prompt stored its two full blocks: each
	// store's extra keys, per block (copied: the decoder reuses its memory).
	var keys [][][]string
	dec := kvevents.NewDecoder()
	for len(keys) < 3 {
		msg, err := sub.Recv()
		require.NoError(t, err, "every salt's blocks were published")
		b, err := dec.Decode(msg.Frames[2])
		require.NoError(t, err)
		for _, ev := range b.Events {
			if ev.Type != kvevents.TypeBlockStored || ev.HasParent {
				continue
			}
			require.Len(t, ev.BlockHashes, 2)
			blocks := make([][]string, 2)
			for i, k := range ev.ExtraKeys {
				blocks[i] = append([]string(nil), k.Strings...)
			}
			keys = append(keys, blocks)
		}
	}
	assert.Equal(t, [][][]string{{nil, nil}, {{"alice"}, nil}, {{"bob"}, nil}}, keys)
}

// A decode worker playing llm-d's sidecar splits a generate request as llm-d's
// (llm-d-router's pkg/sidecar/proxy, APITypeGenerate) does: the prefill worker gets
// the body with kv_transfer_params for a remote decode, stream false, no
// stream_options and sampling_params' max_tokens and min_tokens 1, its other sampling
// parameters kept; the decode reads the KV and answers the client's whole output.
func TestSidecarSplitsAGenerateRequest(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "streamed"}[stream], func(t *testing.T) {
			legs := make(chan map[string]any, 1)
			_, prefillAddr := worker(t, "p0", false, legSpy(legs, nil))
			decode, decodeAddr := worker(t, "d0", true, nil)
			body := `{"token_ids":` + idsPrompt(1, 100) + `,"sampling_params":{"max_tokens":5,"temperature":0.5}`
			if stream {
				body += `,"stream":true,"stream_options":{"include_usage":true}`
			}
			resp, answer := post(t, decodeAddr, generatePath, body+`}`, map[string]string{"x-prefiller-host-port": prefillAddr})
			require.Equal(t, http.StatusOK, resp.StatusCode, answer)
			assert.Equal(t, "d0", resp.Header.Get("x-served-by"))
			assert.Equal(t, "p0", resp.Header.Get("x-prefilled-by"))

			leg := <-legs
			assertPrefillLeg(t, leg)
			assert.Equal(t, map[string]any{"max_tokens": 1.0, "min_tokens": 1.0, "temperature": 0.5}, leg["sampling_params"])
			assert.Equal(t, 1.0, metric(t, prefillAddr, "mockworker_remote_prefill_requests_total"))

			transferred, recomputed := engineCounts(decode)
			assert.Equal(t, 99, transferred)
			assert.Equal(t, 1, recomputed, "the decode computes the prompt's last token only")
			a, _ := generated(t, answer, stream)
			assert.Len(t, a.Choices[0].TokenIDs, 5, "the client's output length, not the prefill's")
			assert.Equal(t, 99, cachedOf(t, a), "vLLM counts the transferred tokens as cached")
		})
	}
}
