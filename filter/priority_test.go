package filter_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
)

// The objective header names the request's objective for the router, whether the
// request is routed by its body or by load alone; a value no objective could have
// names none.
func TestObjectiveHeaderNamesTheRequestsObjective(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	tests := []struct {
		name   string
		header string // the filter's objective header
		path   string
		value  string // "": not sent
		want   string
	}{
		{"a chat naming an objective", "x-gateway-inference-objective", "/v1/chat/completions", "batch", "batch"},
		{"no header", "x-gateway-inference-objective", "/v1/chat/completions", "", ""},
		{"routed by load alone", "x-gateway-inference-objective", "/v1/embeddings", "batch", "batch"},
		{"a configured header name", "x-objective", "/v1/chat/completions", "batch", "batch"},
		{"longer than any objective's name", "x-gateway-inference-objective", "/v1/chat/completions", strings.Repeat("b", 254), ""},
		{"not a name's characters", "x-gateway-inference-objective", "/v1/chat/completions", "batch jobs", ""},
		{"the header off", "", "/v1/chat/completions", "batch", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &requestRecorder{}
			p := newPlane(t, planeOptions{objectiveHeader: tt.header, wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
			sent := tt.header
			if sent == "" {
				sent = "x-gateway-inference-objective"
			}
			var headers []string
			if tt.value != "" {
				headers = []string{sent, tt.value}
			}
			resp, _ := p.post(t, tt.path, chat, headers...)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NotNil(t, rec.last)
			assert.Equal(t, tt.want, rec.last.Objective)
			p.requireIdle(t)
		})
	}
}

// A sheddable request the router refuses for saturation gets the same OpenAI 429 as the
// active-request limit's, with retry-after, and is counted; a critical one is served.
func TestSaturationShedsASheddableRequestWithA429(t *testing.T) {
	p := newPlane(t, planeOptions{objectiveHeader: "x-gateway-inference-objective", objectives: map[string]int{"batch": -1, "chat": 1},
		engineLoad: saturated{}})
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	resp, body := p.post(t, "/v1/chat/completions", chat, "x-gateway-inference-objective", "batch")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("retry-after"))
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	assert.Equal(t, "rate_limit_exceeded", e.Error.Code)
	assert.Equal(t, "requests", e.Error.Type)
	assert.Contains(t, e.Error.Message, "sheddable")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "rate_limit_exceeded"}))
	assert.Equal(t, 1.0, p.counter(t, "kvroute_router_sheddable_shed_total", nil))

	resp, body = p.post(t, "/v1/chat/completions", chat, "x-gateway-inference-objective", "chat")
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = p.post(t, "/v1/chat/completions", chat)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	p.requireIdle(t)
}

// saturated is an engine load of every worker past GIE's queue threshold.
type saturated struct{}

func (saturated) EngineLoad(string) (int, float64, time.Duration, bool) { return 100, 0.5, 0, true }
