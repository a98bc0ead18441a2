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

// worker starts a mock worker named name behind handler wrap (nil: none) and returns
// it and its address.
func worker(t *testing.T, name string, sidecar bool, wrap func(http.Handler) http.Handler) (*Server, string) {
	t.Helper()
	s, err := New(Config{Name: name, Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048},
		Speed: 100, Seed: 1, PrefillSidecar: sidecar})
	require.NoError(t, err)
	h := s.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); s.Close() })
	return s, srv.Listener.Addr().String()
}

// post sends body to addr's path with the headers and returns the answer and its body.
func post(t *testing.T, addr, path, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// metric reads a counter's value from addr's /metrics (0 if absent).
func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return 0
}

// legSpy wraps a prefill worker's handler: it sends each request's body (the
// sidecar's prefill leg), decoded, to legs, and its x-request-id to ids (nil: not).
func legSpy(legs chan<- map[string]any, ids chan<- string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var leg map[string]any
			_ = json.Unmarshal(b, &leg)
			legs <- leg
			if ids != nil {
				ids <- r.Header.Get("x-request-id")
			}
			r.Body = io.NopCloser(strings.NewReader(string(b)))
			h.ServeHTTP(w, r)
		})
	}
}

// assertPrefillLeg checks what every prefill leg of llm-d's sidecar has: kv_transfer_params
// for a remote decode, stream false and no stream_options.
func assertPrefillLeg(t *testing.T, leg map[string]any) {
	t.Helper()
	assert.Equal(t, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, leg["kv_transfer_params"])
	assert.Equal(t, false, leg["stream"])
	assert.NotContains(t, leg, "stream_options")
}

// engineCounts returns the engine's transferred and recomputed prompt tokens.
func engineCounts(s *Server) (transferred, recomputed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ranks[0].engine.TransferredTokens, s.ranks[0].engine.RecomputedTokens
}

var longText = strings.Repeat("several words of a long prompt ", 40)

// A decode worker playing llm-d's sidecar has the prefill worker named in the header
// prefill the prompt (one token, not streamed, kv_transfer_params for a remote
// decode), then decodes with that KV: it computes only the prompt's last token, and
// answers with the whole output, streamed or not, saying who prefilled.
func TestSidecarHasThePrefillWorkerPrefill(t *testing.T) {
	tests := []struct {
		name, path, body string
		stream           bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"` + longText + `"}],"max_completion_tokens":5}`, false},
		{"chat streamed", "/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"` + longText + `"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"completions", "/v1/completions", `{"model":"mock","prompt":"` + longText + `","max_tokens":5}`, false},
		{"completions streamed", "/v1/completions", `{"model":"mock","prompt":"` + longText + `","max_tokens":5,"stream":true}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			legs := make(chan map[string]any, 1)
			ids := make(chan string, 1)
			_, prefillAddr := worker(t, "p0", false, legSpy(legs, ids))
			decode, decodeAddr := worker(t, "d0", true, nil)

			resp, body := post(t, decodeAddr, tt.path, tt.body, map[string]string{"x-prefiller-host-port": prefillAddr})
			require.Equal(t, http.StatusOK, resp.StatusCode, body)
			assert.Equal(t, "d0", resp.Header.Get("x-served-by"))
			assert.Equal(t, "p0", resp.Header.Get("x-prefilled-by"))

			leg := <-legs
			assertPrefillLeg(t, leg)
			assert.Equal(t, 1.0, leg["max_tokens"])
			if _, ok := leg["max_completion_tokens"]; ok {
				assert.Equal(t, 1.0, leg["max_completion_tokens"], "capped when the client set it")
			}
			assert.NotEmpty(t, <-ids, "the leg carries an x-request-id")
			assert.Equal(t, 1.0, metric(t, prefillAddr, "mockworker_remote_prefill_requests_total"))
			assert.Zero(t, metric(t, decodeAddr, "mockworker_remote_prefill_requests_total"))

			transferred, recomputed := engineCounts(decode)
			assert.Positive(t, transferred)
			assert.Equal(t, 1, recomputed, "the decode computes the prompt's last token only")
			assert.Equal(t, float64(transferred), metric(t, decodeAddr, "mockworker_transferred_prompt_tokens_total"))

			var text strings.Builder
			if tt.stream {
				require.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)
				for _, line := range strings.Split(body, "\n") {
					var chunk struct {
						Choices []struct {
							Text  string `json:"text"`
							Delta struct {
								Content string `json:"content"`
							} `json:"delta"`
						} `json:"choices"`
					}
					if data, ok := strings.CutPrefix(line, "data: {"); ok {
						require.NoError(t, json.Unmarshal([]byte("{"+data), &chunk))
						for _, c := range chunk.Choices {
							text.WriteString(c.Text + c.Delta.Content)
						}
					}
				}
			} else {
				var answer struct {
					Choices []struct {
						Text    string `json:"text"`
						Message struct {
							Content string `json:"content"`
						} `json:"message"`
					} `json:"choices"`
					KVTransferParams any `json:"kv_transfer_params"`
				}
				require.NoError(t, json.Unmarshal([]byte(body), &answer), body)
				require.Len(t, answer.Choices, 1)
				text.WriteString(answer.Choices[0].Text + answer.Choices[0].Message.Content)
				assert.Nil(t, answer.KVTransferParams, "a decode's answer has none")
			}
			assert.Len(t, strings.Fields(text.String()), 5, "the client's output length, not the prefill's")
		})
	}
}

// A worker asked to prefill for a remote decode answers where its KV is, as vLLM's
// NIXL connector does; a decode worker asked directly with those kv_transfer_params
// (as the sidecar sends them) reads the KV rather than computing it.
func TestKVTransferParamsOfBothSides(t *testing.T) {
	_, prefillAddr := worker(t, "p0", false, nil)
	prompt := `"model":"mock","prompt":"` + longText + `","max_tokens":1`
	resp, body := post(t, prefillAddr, "/v1/completions", `{`+prompt+`,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var answer struct {
		KVTransferParams map[string]any `json:"kv_transfer_params"`
		Usage            struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &answer))
	host, port, _ := strings.Cut(prefillAddr, ":")
	wantPort, _ := strconv.Atoi(port)
	params := answer.KVTransferParams
	assert.Equal(t, true, params["do_remote_prefill"])
	assert.Equal(t, false, params["do_remote_decode"])
	assert.Equal(t, "p0", params["remote_engine_id"])
	assert.Equal(t, host, params["remote_host"])
	assert.Equal(t, float64(wantPort), params["remote_port"])
	assert.Equal(t, 1.0, params["tp_size"])
	assert.Len(t, params["remote_block_ids"], (answer.Usage.PromptTokens+15)/16)
	assert.Equal(t, 1.0, metric(t, prefillAddr, "mockworker_remote_prefill_requests_total"))

	decode, decodeAddr := worker(t, "d0", false, nil)
	kv, _ := json.Marshal(params)
	resp, body = post(t, decodeAddr, "/v1/completions", `{`+prompt+`,"kv_transfer_params":`+string(kv)+`}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "p0", resp.Header.Get("x-prefilled-by"), "the kv_transfer_params' remote_engine_id")
	transferred, recomputed := engineCounts(decode)
	assert.Equal(t, answer.Usage.PromptTokens-1, transferred)
	assert.Equal(t, 1, recomputed)
	assert.NotContains(t, body, "kv_transfer_params")
}

// What goes wrong on the way to the prefill worker reaches the client as an OpenAI
// error: the prefill worker's own error status, 502 when it cannot be reached or
// answers something that is not a prefill, 400 for a header that is no host:port.
func TestSidecarErrors(t *testing.T) {
	fake := func(status int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "http://127.0.0.1:1/")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	goneAddr := gone.Listener.Addr().String()
	gone.Close()

	tests := []struct {
		name       string
		prefiller  string
		wantStatus int
		wantError  string // in the error message; "" for a success
	}{
		{"the prefill worker fails", fake(http.StatusInternalServerError, `{"error":{"message":"boom"}}`), http.StatusInternalServerError, "answered 500"},
		{"the prefill worker rejects", fake(http.StatusTooManyRequests, ``), http.StatusTooManyRequests, "answered 429"},
		{"a redirect is not followed", fake(http.StatusFound, ``), http.StatusBadGateway, "answered 302"},
		{"unreachable", goneAddr, http.StatusBadGateway, "prefill worker " + goneAddr},
		{"an answer that is not JSON", fake(http.StatusOK, `<html>`), http.StatusBadGateway, "not a JSON object"},
		{"a JSON answer that is not an object", fake(http.StatusOK, `[1,2]`), http.StatusBadGateway, "not a JSON object"},
		{"kv_transfer_params not an object", fake(http.StatusOK, `{"kv_transfer_params":"x"}`), http.StatusBadGateway, "kv_transfer_params"},
		{"an answer too large", fake(http.StatusOK, `{"pad":"`+strings.Repeat("x", maxPrefillAnswer)+`"}`), http.StatusBadGateway, "over 1048576 bytes"},
		{"no port", "127.0.0.1", http.StatusBadRequest, "x-prefiller-host-port"},
		{"a port out of range", "127.0.0.1:70000", http.StatusBadRequest, "want 1-65535"},
		{"a path in the host", "a/b:80", http.StatusBadRequest, "not a host:port"},
		{"a user in the host", "u@127.0.0.1:80", http.StatusBadRequest, "not a host:port"},
		{"no kv_transfer_params: decoded anyway", fake(http.StatusOK, `{"choices":[]}`), http.StatusOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			decode, addr := worker(t, "d0", true, nil)
			resp, body := post(t, addr, "/v1/completions", `{"model":"mock","prompt":"`+longText+`","max_tokens":2}`,
				map[string]string{"x-prefiller-host-port": tt.prefiller})
			assert.Equal(t, tt.wantStatus, resp.StatusCode, body)
			transferred, _ := engineCounts(decode)
			if tt.wantError == "" {
				assert.Equal(t, tt.prefiller, resp.Header.Get("x-prefilled-by"), "named by its address")
				assert.Positive(t, transferred, "the KV counts as transferred")
				return
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &e), body)
			assert.Contains(t, e.Error.Message, tt.wantError)
			assert.Empty(t, resp.Header.Get("x-prefilled-by"))
			assert.Zero(t, transferred, "nothing ran")
		})
	}
}

// A worker that is not a sidecar ignores the header, as a plain vLLM does.
func TestWithoutTheSidecarTheHeaderIsIgnored(t *testing.T) {
	_, prefillAddr := worker(t, "p0", false, nil)
	decode, decodeAddr := worker(t, "d0", false, nil)
	resp, body := post(t, decodeAddr, "/v1/completions", `{"model":"mock","prompt":"`+longText+`","max_tokens":2}`,
		map[string]string{"x-prefiller-host-port": prefillAddr})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Empty(t, resp.Header.Get("x-prefilled-by"))
	assert.Zero(t, metric(t, prefillAddr, "mockworker_remote_prefill_requests_total"))
	transferred, recomputed := engineCounts(decode)
	assert.Zero(t, transferred)
	assert.Greater(t, recomputed, 1, "the decode worker prefilled itself")
}

// The decode waits the transfer of the tokens its cache lacks, scaled by Speed, before
// the request reaches the engine; a client that goes away meanwhile leaves before it
// does.
func TestTransferWait(t *testing.T) {
	tests := []struct {
		name     string
		clientGo bool // the client goes away during the wait
	}{
		{"the transfer ends", false},
		{"the client goes away", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, prefillAddr := worker(t, "p0", false, nil)
			s, err := New(Config{Name: "d0", Engine: sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048},
				Speed: 100, Seed: 1, PrefillSidecar: true})
			require.NoError(t, err)
			waits := make(chan time.Duration)
			done := make(chan time.Time)
			s.after = func(d time.Duration) <-chan time.Time {
				waits <- d
				return done
			}
			srv := httptest.NewServer(s.Handler())
			t.Cleanup(func() { srv.Close(); s.Close() })

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions",
				strings.NewReader(`{"model":"mock","prompt":"`+longText+`","max_tokens":2}`))
			require.NoError(t, err)
			req.Header.Set("x-prefiller-host-port", prefillAddr)
			answered := make(chan *http.Response, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					resp = nil
				}
				answered <- resp
			}()

			wait := <-waits
			s.mu.Lock()
			assert.Zero(t, s.nextID, "the request waits outside the engine")
			s.mu.Unlock()
			if tt.clientGo {
				cancel()
				assert.Nil(t, <-answered)
				srv.Close() // waits for the handler to return
				s.mu.Lock()
				defer s.mu.Unlock()
				assert.Zero(t, s.nextID, "no request reached the engine")
				assert.True(t, s.ranks[0].engine.Idle())
				return
			}
			close(done)
			resp := <-answered
			require.NotNil(t, resp)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			transferred, _ := engineCounts(s)
			// The cache was empty: the wait was for the whole prompt, which the engine then
			// loaded but its last token.
			assert.Equal(t, time.Duration(float64(sim.TransferTime(transferred+1))/100), wait)
		})
	}
}
