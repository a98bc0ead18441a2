package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

// TestLogsCarryNoRequestContentBelowDebug: prompts, model names and headers never reach
// kvroute's log at info level, whatever happens to the request: routed, rejected (400,
// 404, 413, 429), failed upstream, or answered with untrustworthy usage.
func TestLogsCarryNoRequestContentBelowDebug(t *testing.T) {
	const secret = "SECRET-7f3a"
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			d := deployLogging(t, m.req, m.resp, func(c *config.Config) {
				c.Filter.MaxBodyBytes = 4096
				c.Router.MaxActiveRequestsPerWorker = 1
			}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
			post := func(path, body string, headers ...string) int {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, d.envoy.URL+path, strings.NewReader(body))
				require.NoError(t, err)
				for i := 0; i+1 < len(headers); i += 2 {
					req.Header.Set(headers[i], headers[i+1])
				}
				resp, err := d.envoy.Client().Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				return resp.StatusCode
			}
			chatBody := func(model, content string) string {
				return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, content)
			}
			for _, tc := range []struct {
				name, path, body string
				headers          []string
				status           int
			}{
				{"routed", "/v1/chat/completions", chatBody("qwen", secret), []string{"x-secret", secret}, 200},
				{"completions", "/v1/completions", `{"model":"qwen","prompt":"` + secret + `"}`, nil, 200},
				{"malformed", "/v1/chat/completions", `{"model":"qwen","messages":[{"role":"` + secret, nil, 400},
				{"bad field", "/v1/chat/completions", `{"model":"qwen","messages":[{"role":"user","content":{"` + secret + `":1}}]}`, nil, 400},
				{"unknown model", "/v1/chat/completions", chatBody(secret, "x"), nil, 404},
				{"unknown model in the model header", "/v1/embeddings", `{}`, []string{"x-gateway-model-name", secret}, 404},
				{"too large", "/v1/completions", `{"model":"qwen","prompt":"` + strings.Repeat(secret, 500) + `"}`, nil, 413},
				{"upstream 5xx", "/v1/chat/completions", chatBody("qwen", "FAIL_UPSTREAM "+secret), nil, 503},
			} {
				assert.Equal(t, tc.status, post(tc.path, tc.body, tc.headers...), tc.name)
			}
			for _, w := range d.workers {
				w.SetUsage(`{"prompt_tokens":"` + secret + `"}`)
			}
			assert.Equal(t, http.StatusOK, post("/v1/chat/completions", chatBody("qwen", "usage "+secret)))
			// Fill every worker (max 1 request each), then one more: a 429.
			ctx, cancel := context.WithCancel(context.Background())
			for i := range 3 {
				resp, err := d.send(ctx, fmt.Sprintf("HANG_AFTER_FIRST_TOKEN %d %s", i, secret), true)
				require.NoError(t, err)
				defer resp.Body.Close()
				_, err = resp.Body.Read(make([]byte, 1))
				require.NoError(t, err)
			}
			assert.Equal(t, http.StatusTooManyRequests, post("/v1/chat/completions", chatBody("qwen", secret)))
			cancel()
			d.stop()

			out := logs.String()
			require.Contains(t, out, "kvroute serving", "the log was captured")
			require.Contains(t, out, "usage rejected", "a warning about the request was logged")
			assert.NotContains(t, out, secret)
		})
	}
}
