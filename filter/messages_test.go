package filter_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/rewrite"
)

// messagesTurn is an Anthropic Messages API body as Claude Code sends one: a system
// prompt, tools, and the whole conversation so far.
func messagesTurn(system string, messages []string) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":64,"system":[{"type":"text","text":%q}],`+
		`"tools":[{"name":"read_file","description":"Read a file","input_schema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}],`+
		`"messages":[%s]}`, system, strings.Join(messages, ","))
}

// TestMessagesConversationsAreRoutedByPrefix: an agent on Anthropic's Messages API
// (Claude Code against vLLM) resends its whole conversation each turn. vLLM renders it
// as the chat completion it converts it to, so kvroute routes it on that chat: each
// turn goes to the worker holding the previous turn's prefix, though another is idle.
// With messages_paths empty the body is not read (routed by load, no blocks): the
// case that shows the routing is the path's.
func TestMessagesConversationsAreRoutedByPrefix(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("messages_paths_on=%v", on), func(t *testing.T) {
			cfg := explain.DefaultConfig()
			cfg.Enabled = true
			p := newPlane(t, planeOptions{workers: 3, explain: cfg, filterCfg: func(c *filter.Config) {
				if !on {
					c.MessagesPaths = nil
				}
			}})
			system := strings.Repeat("You are a coding agent working in a Go repository. ", 20)
			messages := []string{`{"role":"user","content":"Fix the failing test, please."}`}
			var worker string
			for turn := range 4 {
				resp, out := p.post(t, "/v1/messages", messagesTurn(system, messages), "x-kvroute-explain", "1")
				require.Equal(t, http.StatusOK, resp.StatusCode, out)
				assert.Contains(t, out, `"type":"message"`, "the worker answered as vLLM's /v1/messages")
				var tr explain.Trace
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
				if !on {
					assert.Zero(t, tr.Blocks, "turn %d: the body is not read", turn)
					return
				}
				assert.Positive(t, tr.Blocks, "turn %d is routed on its prompt", turn)
				if turn > 0 {
					assert.Equal(t, worker, tr.Worker, "turn %d stays with its prefix", turn)
					assert.Positive(t, tr.PredictedCachedTokens, "turn %d", turn)
				}
				worker = tr.Worker
				messages = append(messages,
					fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"Reading it (%d)."},{"type":"tool_use","id":"toolu_%d","name":"read_file","input":{"path":"router/router.go"}}]}`, turn, turn),
					fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_%d","content":"package router %d"}]}`, turn, turn))
				// Another conversation keeps a worker busy.
				p.post(t, "/v1/chat/completions", chat(fmt.Sprint("other conversation ", turn), false))
			}
			assert.Equal(t, 4.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "routed"})-4, "the Messages turns and the chats were routed on their prompts")
		})
	}
}

// TestMessagesInlineSystemTurnsAreRoutedByPrefix: Claude Code appends a system message
// to messages on almost every turn. vLLM keeps it in place or folds it into a
// neighbour, both only changing the conversation's end, so kvroute routes such turns
// on their prompts too, each to the worker holding the previous turn's.
func TestMessagesInlineSystemTurnsAreRoutedByPrefix(t *testing.T) {
	cfg := explain.DefaultConfig()
	cfg.Enabled = true
	p := newPlane(t, planeOptions{workers: 3, explain: cfg})
	system := strings.Repeat("You are a coding agent working in a Go repository. ", 20)
	messages := []string{`{"role":"user","content":"Fix the failing test, please."}`,
		`{"role":"system","content":"<system-reminder>Turn 0.</system-reminder>"}`}
	var worker string
	for turn := range 4 {
		resp, out := p.post(t, "/v1/messages", messagesTurn(system, messages), "x-kvroute-explain", "1")
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
		var tr explain.Trace
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
		assert.Positive(t, tr.Blocks, "turn %d is routed on its prompt", turn)
		if turn > 0 {
			assert.Equal(t, worker, tr.Worker, "turn %d stays with its prefix", turn)
			assert.Positive(t, tr.PredictedCachedTokens, "turn %d", turn)
		}
		worker = tr.Worker
		messages = append(messages,
			fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"Reading it (%d)."},{"type":"tool_use","id":"toolu_%d","name":"read_file","input":{"path":"router/router.go"}}]}`, turn, turn),
			fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_%d","content":"package router %d"}]}`, turn, turn),
			fmt.Sprintf(`{"role":"system","content":"<system-reminder>Turn %d.</system-reminder>"}`, turn+1))
		p.post(t, "/v1/chat/completions", chat(fmt.Sprint("other conversation ", turn), false))
	}
	assert.Zero(t, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
}

// anthropicError is Anthropic's error body: {"type":"error","error":{"type","message"}}.
type anthropicError struct {
	Type  string
	Error struct{ Type, Message string }
}

// TestMessagesErrorsAreAnthropicShaped: Anthropic's clients read Anthropic's error
// body, so kvroute's own errors on messages_paths, and on the paths under them
// (count_tokens, routed by load), are written as vLLM's /v1/messages writes its own;
// every other path keeps OpenAI's.
func TestMessagesErrorsAreAnthropicShaped(t *testing.T) {
	tests := []struct {
		name, path, body string
		headers          []string
		status           int
		errorType        string
	}{
		{"not JSON", "/v1/messages", `{"model":`, nil, http.StatusBadRequest, "invalid_request_error"},
		{"no model", "/v1/messages", `{"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, nil, http.StatusBadRequest, "invalid_request_error"},
		{"a model no worker serves", "/v1/messages", `{"model":"other","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, nil, http.StatusNotFound, "not_found_error"},
		{"count_tokens for a model no worker serves", "/v1/messages/count_tokens", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`,
			[]string{"x-gateway-model-name", "other"}, http.StatusNotFound, "not_found_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 2, models: [][]string{{"m"}, {"m"}}})
			resp, out := p.post(t, tt.path, tt.body, tt.headers...)
			require.Equal(t, tt.status, resp.StatusCode, out)
			var e anthropicError
			require.NoError(t, json.Unmarshal([]byte(out), &e), out)
			assert.Equal(t, "error", e.Type, out)
			assert.Equal(t, tt.errorType, e.Error.Type, out)
			assert.NotEmpty(t, e.Error.Message, out)
			assert.NotContains(t, out, `"code"`, "not OpenAI's shape")
			for _, w := range p.workers {
				assert.Zero(t, w.count(), "no worker was sent it")
			}
		})
	}
	t.Run("other paths keep OpenAI's shape", func(t *testing.T) {
		p := newPlane(t, planeOptions{workers: 2, models: [][]string{{"m"}, {"m"}}})
		for _, path := range []string{"/v1/chat/completions", "/v1/messagesx"} {
			resp, out := p.post(t, path, `{"model":"other","messages":[{"role":"user","content":"hi"}]}`, "x-gateway-model-name", "other")
			require.Equal(t, http.StatusNotFound, resp.StatusCode, out)
			assert.Contains(t, out, `"code":"model_not_found"`, path)
		}
	})
}

// TestMessagesPathErrorsAreAnthropicShapedForEveryMethod: the messages path itself is
// Anthropic's whatever the method: a request on it that kvroute routes by load (not a
// POST) gets its errors in Anthropic's shape too, as the paths under it do.
func TestMessagesPathErrorsAreAnthropicShapedForEveryMethod(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, models: [][]string{{"m"}, {"m"}}})
	req, err := http.NewRequest(http.MethodGet, p.envoy.URL+"/v1/messages", nil)
	require.NoError(t, err)
	req.Header.Set("x-gateway-model-name", "other")
	resp, err := p.envoy.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, resp.StatusCode, string(out))
	var e anthropicError
	require.NoError(t, json.Unmarshal(out, &e), string(out))
	assert.Equal(t, "error", e.Type, string(out))
	assert.Equal(t, "not_found_error", e.Error.Type, string(out))
}

// TestMessagesShedWithAnthropicsRetryableError: a sheddable Messages request the pool
// is too saturated for gets a 429 with retry-after in Anthropic's shape
// (rate_limit_error), which Anthropic's clients retry.
func TestMessagesShedWithAnthropicsRetryableError(t *testing.T) {
	p := newPlane(t, planeOptions{objectiveHeader: "x-gateway-inference-objective", objectives: map[string]int{"batch": -1},
		engineLoad: saturated{}})
	resp, out := p.post(t, "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`,
		"x-gateway-inference-objective", "batch")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, out)
	assert.Equal(t, "1", resp.Header.Get("retry-after"))
	var e anthropicError
	require.NoError(t, json.Unmarshal([]byte(out), &e), out)
	assert.Equal(t, "rate_limit_error", e.Error.Type, out)
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "rate_limit_exceeded"}))
}

// TestMessagesKvrouteDoesNotRebuildGoByLoad: a Messages body whose prompt kvroute does
// not rebuild exactly (an image; a tool_use without the id vLLM would invent) is routed
// by load, served, and counted load_only: never refused for it.
func TestMessagesKvrouteDoesNotRebuildGoByLoad(t *testing.T) {
	tests := []struct{ name, body string }{
		{"an image", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"what is this?"}]}]}`},
		{"a tool_use without an id", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"read it"},{"role":"assistant","content":[{"type":"tool_use","name":"read_file","input":{}}]},{"role":"user","content":"go on"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := explain.DefaultConfig()
			cfg.Enabled = true
			p := newPlane(t, planeOptions{workers: 2, explain: cfg})
			resp, out := p.post(t, "/v1/messages", tt.body, "x-kvroute-explain", "1")
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			var tr explain.Trace
			require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
			assert.Zero(t, tr.Blocks)
			assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
		})
	}
}

// TestMessagesModelRewrite: a model rewrite applies to a Messages body as to a chat's:
// routed on the target, forwarded with it. The response gives the client back its
// model: a whole message's top-level "model" is renamed, and so is the "model" a
// stream's message_start names inside its "message" object; the engine's name is left
// nowhere, and the rest of the stream passes whole.
func TestMessagesModelRewrite(t *testing.T) {
	table := rewrite.NewTable(rewrite.Config{
		{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"claude"}, Targets: []rewrite.Target{{Model: "qwen"}}}}},
	}, &draws{values: []int64{0, 0}}, nil)
	p := newPlane(t, planeOptions{workers: 2, models: [][]string{{"qwen"}, {"other"}}, rewrites: table})
	const body = `{"model":"claude","max_tokens":8,"stream":%v,"messages":[{"role":"user","content":"hello there"}]}`
	resp, out := p.post(t, "/v1/messages", fmt.Sprintf(body, false))
	require.Equal(t, http.StatusOK, resp.StatusCode, out)
	assert.Equal(t, "w0", resp.Header.Get("x-served-by"), "routed on the target")
	assert.Contains(t, out, `"model":"claude"`, "a whole message gets the client's model back")
	assert.Contains(t, string(p.workers[0].Served()[0].Body), `"model":"qwen"`, "forwarded with the target")

	resp, out = p.post(t, "/v1/messages", fmt.Sprintf(body, true))
	require.Equal(t, http.StatusOK, resp.StatusCode, out)
	assert.Contains(t, out, "event: message_start\ndata: {", out)
	assert.Regexp(t, `event: message_start\ndata: \{[^\n]*"message":\{[^\n]*"model":"claude"`, out, "message_start's model is the client's")
	assert.NotContains(t, out, "qwen", "the engine's name is left nowhere")
	assert.Contains(t, out, "event: message_stop", "the stream passes whole")
}

// TestMessagesUsageIsCounted: a Messages response's usage, in Anthropic's shape (cache
// reads counted apart from input_tokens), reaches the reported-usage counters as a chat
// completion's does: 10 prompt tokens of which 4 cached, whole or streamed.
func TestMessagesUsageIsCounted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 2})
			resp, out := p.post(t, "/v1/messages", fmt.Sprintf(`{"model":"m","max_tokens":8,"stream":%v,"messages":[{"role":"user","content":"hello"}]}`, stream))
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			p.waitIdle(t)
			assert.Equal(t, 10.0, p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil))
			assert.Equal(t, 4.0, p.counter(t, "kvroute_filter_reported_cached_tokens_total", nil))
		})
	}
}

// TestConvertedRequestsAreCountedByAPI: kvroute_filter_converted_requests_total says,
// per API, how many Responses and Messages requests were routed on their rebuilt chat
// and how many by load, for an operator to see which of an agent's bodies the rebuild
// does not take.
func TestConvertedRequestsAreCountedByAPI(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, responses: true})
	for _, r := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`},
		{"/v1/responses", `{"model":"m","store":false,"input":"hello"}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
	} {
		resp, out := p.post(t, r.path, r.body)
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
	}
	for _, c := range []struct {
		api, outcome string
		want         float64
	}{{"messages", "routed", 1}, {"messages", "load_only", 1}, {"responses", "routed", 1}, {"responses", "load_only", 0}, {"chat", "routed", 0}} {
		assert.Equal(t, c.want, p.counter(t, "kvroute_filter_converted_requests_total", map[string]string{"api": c.api, "outcome": c.outcome}), "%s %s", c.api, c.outcome)
	}
}
