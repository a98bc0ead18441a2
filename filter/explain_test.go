package filter_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
)

// TestExplainAnswersOnlyWhenAskedAndNeverForwardsTheHeader drives explain through the
// data plane in each body mode: what the client sees (the decision header) and what the
// worker sees (never the explain header).
func TestExplainAnswersOnlyWhenAskedAndNeverForwardsTheHeader(t *testing.T) {
	tests := []struct {
		name       string
		enabled    bool
		path       string
		header     []string // request headers, name then value
		wantAnswer bool
	}{
		{"enabled and asked", true, "/v1/chat/completions", []string{"x-kvroute-explain", "1"}, true},
		{"enabled, not asked", true, "/v1/chat/completions", nil, false},
		{"enabled, asked with 0", true, "/v1/chat/completions", []string{"x-kvroute-explain", "0"}, false},
		{"disabled: the header is ignored", false, "/v1/chat/completions", []string{"x-kvroute-explain", "1"}, false},
		{"a route that turns explain off", true, "/quiet/v1/chat/completions", []string{"x-kvroute-explain", "1"}, false},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					cfg := explain.DefaultConfig()
					cfg.Enabled = tt.enabled
					p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp, explain: cfg,
						filterCfg: func(c *filter.Config) { c.ChatPaths = append(c.ChatPaths, "/quiet/v1/chat/completions") },
						envoyCfg: func(c *envoytest.Config) {
							c.Routes = []envoytest.Route{{PathPrefix: "/quiet/", GRPCInitialMetadata: map[string]string{filter.ExplainMetadataKey: "false"}}}
						}})
					resp, body := p.post(t, tt.path, chat("why here?", false), tt.header...)
					require.Equal(t, http.StatusOK, resp.StatusCode, body)
					served := p.servedRequests()
					require.Len(t, served, 1)
					assert.NotContains(t, served[0].Header, "X-Kvroute-Explain", "the worker never sees the explain header")

					answer := resp.Header.Get(explain.ResponseHeader)
					if !tt.wantAnswer {
						assert.Empty(t, answer, "nothing leaks")
						return
					}
					assert.LessOrEqual(t, len(answer), explain.MaxHeaderBytes)
					var tr explain.Trace
					require.NoError(t, json.Unmarshal([]byte(answer), &tr), answer)
					assert.Equal(t, resp.Header.Get("x-served-by"), tr.Worker, "the answer names the worker that served")
					require.Len(t, tr.Candidates, 2)
					assert.Equal(t, tr.Worker, tr.Candidates[0].Worker, "the chosen worker first")
					assert.Equal(t, tr.Address, tr.Candidates[0].Address)
					assert.LessOrEqual(t, tr.Candidates[0].Cost, tr.Candidates[1].Cost)
					assert.Positive(t, tr.PromptTokens)
					for _, ex := range p.envoy.Exchanges() {
						assert.Empty(t, ex.IgnoredMutations)
					}
					p.requireIdle(t)
				})
			}
		})
	}
}

func TestExplainAnswersALoadOnlyDecisionToo(t *testing.T) {
	cfg := explain.DefaultConfig()
	cfg.Enabled = true
	p := newPlane(t, planeOptions{explain: cfg})
	req, err := http.NewRequest(http.MethodGet, p.envoy.URL+"/v1/models", nil)
	require.NoError(t, err)
	req.Header.Set("x-kvroute-explain", "true")
	resp, err := p.envoy.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	var tr explain.Trace
	require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
	assert.Zero(t, tr.PromptTokens, "routed by load alone")
	served := p.servedRequests()
	require.Len(t, served, 1)
	assert.NotContains(t, served[0].Header, "X-Kvroute-Explain")
}

func TestABadRouteExplainSettingIsAnInvalidRoutePolicy(t *testing.T) {
	p := newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
		c.Routes = []envoytest.Route{{PathPrefix: "/v1/", GRPCInitialMetadata: map[string]string{filter.ExplainMetadataKey: "sometimes"}}}
	}})
	resp, body := p.post(t, "/v1/chat/completions", chat("x", false))
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	assert.Contains(t, body, "invalid_route_policy")
	assert.Contains(t, body, filter.ExplainMetadataKey)
}

func TestSampledDecisionsReachTheRecorder(t *testing.T) {
	cfg := explain.DefaultConfig()
	cfg.SampleRate = 0.5
	p := newPlane(t, planeOptions{explain: cfg})
	for range 4 {
		resp, _ := p.post(t, "/v1/chat/completions", chat("sample me", false))
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	got := p.explain.Recent(10)
	require.Len(t, got, 2, "one decision in two")
	assert.Len(t, got[0].Candidates, 2)
}

// TestSessionHeaderKeepsARewrittenSessionOnItsWorker: the session header reaches the
// router, whose session credit keeps a session whose prompt changed entirely on its
// worker against a small load gap, while a new session goes to the idle worker.
func TestSessionHeaderKeepsARewrittenSessionOnItsWorker(t *testing.T) {
	params := scoring.DynamoParams()
	params.SessionAffinityWeight = 1
	p := newPlane(t, planeOptions{params: params, sessions: true})
	// No shared system prompt: a compacted history shares nothing with the original.
	user := func(text string) string { return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}` }
	first, _ := p.post(t, "/v1/chat/completions", user("the original, long conversation history of this agent"), "x-session-id", "agent-7")
	worker := first.Header.Get("x-served-by")
	release := p.book(t, worker, 0, 3) // a small load gap against the session's worker
	defer release()

	compacted, _ := p.post(t, "/v1/chat/completions", user("a summary of what was said so far"), "x-session-id", "agent-7")
	assert.Equal(t, worker, compacted.Header.Get("x-served-by"), "the session stays")
	other, _ := p.post(t, "/v1/chat/completions", user("another agent's own summary of its work"), "x-session-id", "agent-8")
	assert.NotEqual(t, worker, other.Header.Get("x-served-by"), "another session follows the load")
	none, _ := p.post(t, "/v1/chat/completions", user("a third summary without any session"))
	assert.NotEqual(t, worker, none.Header.Get("x-served-by"), "so does a request without the header")
}

// TestAgentSessionHeadersNameTheSession: coding agents send a session header of their
// own (Claude Code x-claude-code-session-id, OpenCode x-session-affinity, Codex
// session-id): each names the session when x-session-id is absent, so an agent's
// turns keep their worker without client config; x-session-id, when sent, wins.
func TestAgentSessionHeadersNameTheSession(t *testing.T) {
	params := scoring.DynamoParams()
	params.SessionAffinityWeight = 1
	user := func(text string) string { return `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}` }
	for _, header := range session.DefaultAgentHeaders() {
		t.Run(header, func(t *testing.T) {
			p := newPlane(t, planeOptions{params: params, sessions: true})
			first, _ := p.post(t, "/v1/chat/completions", user("the original, long conversation history of this agent"), header, "agent-7")
			worker := first.Header.Get("x-served-by")
			release := p.book(t, worker, 0, 3)
			defer release()
			compacted, _ := p.post(t, "/v1/chat/completions", user("a summary of what was said so far"), header, "agent-7")
			assert.Equal(t, worker, compacted.Header.Get("x-served-by"), "the session stays")
			// x-session-id names another session: it is the one read.
			other, _ := p.post(t, "/v1/chat/completions", user("another agent's own summary of its work"), header, "agent-7", "x-session-id", "agent-8")
			assert.NotEqual(t, worker, other.Header.Get("x-served-by"), "x-session-id wins")
		})
	}
}
