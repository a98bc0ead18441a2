package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/enginemetrics"
	"github.com/kvroute/kvroute/sim"
)

// samplesOf reads a streamed generate answer of several choices: each choice's token
// ids joined in index order, its last finish_reason, and the usage chunk's usage.
func samplesOf(t *testing.T, body string) (ids map[int][]uint32, finish map[int]string, usage generateAnswer) {
	t.Helper()
	_, chunks := generated(t, body, true)
	ids, finish = map[int][]uint32{}, map[int]string{}
	for _, c := range chunks {
		if len(c.Choices) == 0 {
			usage = c
			continue
		}
		require.Len(t, c.Choices, 1, "a chunk carries one choice")
		ch := c.Choices[0]
		ids[ch.Index] = append(ids[ch.Index], ch.TokenIDs...)
		if ch.FinishReason != nil {
			finish[ch.Index] = *ch.FinishReason
		}
	}
	return ids, finish, usage
}

// sampling_params.n runs n samples of the prompt as vLLM v1's parallel sampling does:
// the answer has n choices of index 0..n-1, each of max_tokens tokens; the usage
// counts the prompt once and the completion tokens of all n. A stream's chunks each
// carry one choice's tokens and its index, every choice ends with finish_reason
// length, and the usage chunk sums the same way. A second request of the prompt hits
// the prefix cache.
func TestGenerateServesParallelSamples(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			url := generateWorker(t, Config{})
			body := `{"token_ids":` + idsPrompt(1, 40) + `,"sampling_params":{"max_tokens":5,"n":4}`
			if stream {
				body += `,"stream":true,"stream_options":{"include_usage":true}`
			}
			body += `}`
			for turn := range 2 {
				status, answer := postWithin(t, 10*time.Second, url+generatePath, body)
				require.Equal(t, http.StatusOK, status, answer)
				var a generateAnswer
				if !stream {
					a, _ = generated(t, answer, false)
					require.Len(t, a.Choices, 4, answer)
					for i, c := range a.Choices {
						assert.Equal(t, i, c.Index)
						assert.Len(t, c.TokenIDs, 5)
						require.NotNil(t, c.FinishReason)
						assert.Equal(t, "length", *c.FinishReason)
					}
				} else {
					ids, finish, usage := samplesOf(t, answer)
					require.Len(t, ids, 4, answer)
					for i := range 4 {
						assert.Len(t, ids[i], 5, "choice %d", i)
						assert.Equal(t, "length", finish[i], "choice %d", i)
					}
					a = usage
				}
				require.NotNil(t, a.Usage, answer)
				assert.Equal(t, 40, a.Usage.PromptTokens, "the prompt counts once")
				assert.Equal(t, 20, a.Usage.CompletionTokens, "the completions of all four")
				assert.Equal(t, 60, a.Usage.TotalTokens)
				if turn == 1 {
					assert.Equal(t, 32, cachedOf(t, a), "the prompt's two full blocks are cached")
				}
			}
		})
	}
}

// The n samples are n engine requests: on a worker of two batch slots, n = 4 runs two
// and queues two, and /metrics says so; n above max_num_seqs gets vLLM's 400; a
// client that goes away aborts all of them.
func TestParallelSamplesTakeABatchSlotEach(t *testing.T) {
	s, err := New(Config{Name: "w0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 2, MaxBatchedTokens: 2048}, Speed: 1, Seed: 1})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })

	status, answer := postWithin(t, 10*time.Second, srv.URL+generatePath, `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1,"n":3}}`)
	require.Equal(t, http.StatusBadRequest, status, answer)
	assert.Contains(t, answer, "sampling_params.n must be at most the server's max_num_seqs (2), got 3.")
	status, answer = postWithin(t, 10*time.Second, srv.URL+generatePath, `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1,"n":2}}`)
	require.Equal(t, http.StatusOK, status, answer)

	// n = 2 twice: two run, two wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 2 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+generatePath,
				strings.NewReader(`{"token_ids":`+idsPrompt(1, 20)+`,"sampling_params":{"max_tokens":3000,"n":2},"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		waiting, _, err := enginemetrics.Parse(strings.NewReader(string(body)), "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
		return err == nil && waiting == 2 && strings.Contains(string(body), "\nvllm:num_requests_running 2\n")
	}, 30*time.Second, 5*time.Millisecond, "two samples run in the two slots and two wait")
	cancel()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.ranks[0].engine.Idle() && len(s.waiters) == 0
	}, 30*time.Second, time.Millisecond, "every sample of a gone client is aborted")
}

// n above 1 with disaggregation is refused (the worker disaggregates one sequence).
func TestParallelSamplesAreNotDisaggregated(t *testing.T) {
	url := generateWorker(t, Config{})
	status, answer := postWithin(t, 10*time.Second, url+generatePath,
		`{"token_ids":[1,2,3],"sampling_params":{"max_tokens":1,"n":2},"kv_transfer_params":{"do_remote_decode":true}}`)
	require.Equal(t, http.StatusBadRequest, status, answer)
	var e struct{ Error struct{ Message string } }
	require.NoError(t, json.Unmarshal([]byte(answer), &e))
	assert.Contains(t, e.Error.Message, "sampling_params.n must be 1")
}
