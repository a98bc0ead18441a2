package filter_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/hf"
)

// TestHostileUsageIsIgnoredAndCounted: usage values a worker must not be trusted with
// (issue 8: a negative count used to panic the process) never reach the reported
// counters; they are counted as rejected, and the client's response is untouched.
func TestHostileUsageIsIgnoredAndCounted(t *testing.T) {
	tests := []struct {
		name  string
		usage string
	}{
		{"negative prompt tokens", `{"prompt_tokens":-1,"completion_tokens":1}`},
		{"negative cached tokens", `{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":-3}}`},
		{"non-finite", `{"prompt_tokens":1e300}`},
		{"above 2^31", `{"prompt_tokens":4294967296}`},
		{"cached above prompt", `{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11}}`},
	}
	for _, stream := range []bool{true, false} {
		p := newPlane(t, planeOptions{workers: 1})
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p.workers[0].SetUsage(tt.usage)
				before := p.counter(t, "kvroute_filter_usage_rejected_total", nil)
				resp, body := p.post(t, "/v1/chat/completions", chat("usage "+tt.name, stream))
				require.Equal(t, 200, resp.StatusCode, body)
				assert.Contains(t, body, tt.usage, "the client sees the worker's usage unchanged")
				assert.Equal(t, before+1, p.counter(t, "kvroute_filter_usage_rejected_total", nil))
				assert.Zero(t, p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil))
				assert.Zero(t, p.counter(t, "kvroute_filter_reported_cached_tokens_total", nil))
				p.requireIdle(t)
			})
		}
		p.workers[0].SetUsage("")
		resp, _ := p.post(t, "/v1/chat/completions", chat("sane usage", stream))
		require.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, 10.0, p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil), "a sane usage still counts")
	}
}

// TestHostileBodies: bodies built to exhaust memory or the stack get a 400 naming the
// limit (or are routed, when within it) in both request body modes.
func TestHostileBodies(t *testing.T) {
	ids := func(n int) string { return `{"model":"m","prompt":[` + strings.Repeat("7,", n-1) + `7]}` }
	tests := []struct {
		name   string
		body   string
		status int
		msg    string
	}{
		{"four million brackets", strings.Repeat("[", 4<<20), 400, "must be a JSON object"},
		{"four million brackets in a field", `{"model":"m","prompt":"x","extra":` + strings.Repeat("[", 4<<20), 400, "max_json_depth"},
		{"a message nested past max_json_depth", `{"model":"m","prompt":"x","extra":` + strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat("}", 200) + `}`, 400, "deeper than 128 levels (max_json_depth)"},
		{"a million token ids are routed", ids(1 << 20), 200, ""},
		{"one id past max_prompt_tokens", ids(1<<20 + 1), 400, "max_prompt_tokens"},
	}
	for _, m := range modes[:2] {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp, workers: 1,
				filterCfg: func(c *filter.Config) { c.MaxBodyBytes = 8 << 20 },
				envoyCfg:  func(c *envoytest.Config) { c.BufferLimit = 16 << 20 }})
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					resp, body := p.post(t, "/v1/completions", tt.body)
					require.Equal(t, tt.status, resp.StatusCode, truncate(body))
					if tt.msg != "" {
						var e openAIError
						require.NoError(t, json.Unmarshal([]byte(body), &e))
						assert.Contains(t, e.Error.Message, tt.msg)
					}
					p.requireIdle(t)
				})
			}
		})
	}
}

// TestHostileTextPromptIsRoutedOnItsFirstIDs: 4 MiB prompt texts built to make the
// exact tokenizer slow (a digit a token, one 4 MiB pre-token of spaces), as a
// completions prompt or a chat's message, are routed on the ids their encoding stopped
// at (max_prompt_tokens, the tokenizer's bound on long words), counted, and marked in
// the trace: not refused, not failed, not routed by load alone.
func TestHostileTextPromptIsRoutedOnItsFirstIDs(t *testing.T) {
	qwen3, err := hf.LoadBuiltin("qwen3")
	require.NoError(t, err)
	maxTokens := filter.DefaultConfig().MaxPromptTokens
	encoder := tokenize.Pipeline{Tokenizer: qwen3, Renderer: tokenize.ChatML{}, MaxTokens: maxTokens}
	cfg := explain.DefaultConfig()
	cfg.SampleRate = 1
	p := newPlane(t, planeOptions{workers: 1, tokenizers: router.OneTokenizer(encoder), explain: cfg,
		envoyCfg: func(c *envoytest.Config) { c.BufferLimit = 8 << 20 }})
	limit := filter.DefaultConfig().MaxBodyBytes
	fill := func(s string, overhead int) string { return strings.Repeat(s, limit/len(s))[:limit-overhead] }
	completions := func(s string) string {
		const head, tail = `{"model":"m","prompt":"`, `"}`
		return head + fill(s, len(head)+len(tail)) + tail
	}
	chat := func(s string) string {
		const head, tail = `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return head + fill(s, len(head)+len(tail)) + tail
	}
	tests := []struct {
		name, path, body string
		wantIDs          int // the ids routed on
	}{
		{"digits as a completions prompt", "/v1/completions", completions("1234567890"), maxTokens},
		{"spaces as a completions prompt", "/v1/completions", completions(" "), 0},
		{"digits in a chat", "/v1/chat/completions", chat("1234567890"), maxTokens},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Len(t, tt.body, limit)
			before := p.counter(t, "kvroute_router_prompts_cut_total", nil)
			resp, body := p.post(t, tt.path, tt.body)
			require.Equal(t, 200, resp.StatusCode, truncate(body))
			assert.Equal(t, before+1, p.counter(t, "kvroute_router_prompts_cut_total", nil))
			assert.Zero(t, p.counter(t, "kvroute_router_prompt_fallbacks_total", nil))
			traces := p.explain.Recent(1)
			require.Len(t, traces, 1)
			got := traces[0]
			assert.Equal(t, tt.wantIDs/4, got.Blocks, "routed on the full blocks of the ids (block size 4)")
			assert.Positive(t, got.PromptEstimatedTokens, "the rest's tokens are estimated")
			assert.Equal(t, tt.wantIDs+got.PromptEstimatedTokens, got.PromptTokens)
			p.requireIdle(t)
		})
	}
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// TestBodyCapAndTheGRPCLimitAgree: a BUFFERED body travels as one gRPC message. With
// max_body_bytes above grpc-go's default 4 MiB receive limit, a body at the cap is
// routed and one byte over gets kvroute's OpenAI 413, never a gRPC ResourceExhausted
// that Envoy would turn into a bare 500.
func TestBodyCapAndTheGRPCLimitAgree(t *testing.T) {
	const limit = 6 << 20
	p := newPlane(t, planeOptions{workers: 1,
		filterCfg: func(c *filter.Config) { c.MaxBodyBytes = limit },
		envoyCfg:  func(c *envoytest.Config) { c.BufferLimit = 16 << 20 }})
	prefix, suffix := `{"model":"m","prompt":"`, `"}`
	atCap := prefix + strings.Repeat("x", limit-len(prefix)-len(suffix)) + suffix
	resp, body := p.post(t, "/v1/completions", atCap)
	require.Equal(t, 200, resp.StatusCode, truncate(body))
	resp, body = p.post(t, "/v1/completions", atCap+" ")
	require.Equal(t, 413, resp.StatusCode, truncate(body))
	var e openAIError
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.NotNil(t, e.Error.Code)
	assert.Equal(t, "request_too_large", *e.Error.Code)
	assert.Contains(t, e.Error.Message, "6291456")
	p.requireIdle(t)
}
