package filter_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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

// A request without a body (its headers end the stream: a GET of /v1/models, a POST of
// nothing) is never shed, whatever objective it names: GIE's endpoint picker (v1.0 to
// v1.5, handlers/request.go HandleRequestHeaders) routes such a request to a random
// endpoint before it reads any header, so no objective, priority or admission applies
// to it. A request with a body is admitted by its objective in GIE whatever its path
// (the director parses every body), and in kvroute too, read or not.
func TestARequestWithoutABodyIsNeverShed(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	tests := []struct {
		name          string
		mode          extprocfilterv3.ProcessingMode_BodySendMode
		method, path  string
		body          string
		want          int
		wantObjective string
	}{
		{"a GET of the model list", buffered, http.MethodGet, "/v1/models", "", http.StatusOK, ""},
		{"a POST without a body to a path routed by load", buffered, http.MethodPost, "/v1/embeddings", "", http.StatusOK, ""},
		{"a GET, the body not read (STREAMED)", streamed, http.MethodGet, "/v1/models", "", http.StatusOK, ""},
		{"a body on a path routed by load", buffered, http.MethodPost, "/v1/embeddings", chat, http.StatusTooManyRequests, "batch"},
		{"a body not read (STREAMED)", streamed, http.MethodPost, "/v1/chat/completions", chat, http.StatusTooManyRequests, "batch"},
		{"a body read", buffered, http.MethodPost, "/v1/chat/completions", chat, http.StatusTooManyRequests, "batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &requestRecorder{}
			p := newPlane(t, planeOptions{reqMode: tt.mode, respMode: streamed, objectiveHeader: "x-gateway-inference-objective",
				objectives: map[string]int{"batch": -1}, engineLoad: saturated{},
				// The config's mode is only for Envoys that do not announce theirs.
				filterCfg:  func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered },
				wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			req, err := http.NewRequest(tt.method, p.envoy.URL+tt.path, body)
			require.NoError(t, err)
			req.Header.Set("x-gateway-inference-objective", "batch")
			resp, err := p.envoy.Client().Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, tt.want, resp.StatusCode)
			require.NotNil(t, rec.last)
			assert.Equal(t, tt.wantObjective, rec.last.Objective)
			assert.Equal(t, float64(tt.want/http.StatusTooManyRequests), p.counter(t, "kvroute_router_sheddable_shed_total", nil))
			p.requireIdle(t)
		})
	}
}

// A request carrying the objective header more than once (say a client's value, then
// one an Envoy filter before ext_proc appends) names the last value's objective, as
// GIE's endpoint picker reads it (handlers/request.go, HandleRequestHeaders: each
// header entry overwrites the one before). kvroute read the first, so the same request
// had another priority behind kvroute than behind GIE.
func TestTheLastObjectiveHeaderValueNamesTheObjective(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	tests := []struct {
		name          string
		values        []string
		want          int
		wantObjective string
	}{
		{"a client's critical objective, then the route's sheddable one", []string{"chat", "batch"}, http.StatusTooManyRequests, "batch"},
		{"a client's sheddable objective, then the route's critical one", []string{"batch", "chat"}, http.StatusOK, "chat"},
		{"the last value names no objective", []string{"batch", "two words"}, http.StatusOK, ""},
		{"one value", []string{"batch"}, http.StatusTooManyRequests, "batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &requestRecorder{}
			p := newPlane(t, planeOptions{objectiveHeader: "x-gateway-inference-objective", objectives: map[string]int{"batch": -1, "chat": 10},
				engineLoad: saturated{}, wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
			req, err := http.NewRequest(http.MethodPost, p.envoy.URL+"/v1/chat/completions", strings.NewReader(chat))
			require.NoError(t, err)
			for _, v := range tt.values {
				req.Header.Add("x-gateway-inference-objective", v)
			}
			resp, err := p.envoy.Client().Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			assert.Equal(t, tt.want, resp.StatusCode)
			require.NotNil(t, rec.last)
			assert.Equal(t, tt.wantObjective, rec.last.Objective)
			p.requireIdle(t)
		})
	}
}

// An objective's name comes from a client's header: it must never become a metric
// label, or each new name would add series. Requests naming defined, undefined, shed
// and served objectives leave no series naming any of them.
func TestObjectiveNamesNeverBecomeMetricLabels(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	p := newPlane(t, planeOptions{objectiveHeader: "x-gateway-inference-objective", objectives: map[string]int{"batch-objective": -1, "chat-objective": 10},
		engineLoad: saturated{}})
	names := []string{"batch-objective", "chat-objective", "client-made-up-1", "client-made-up-2"}
	for _, name := range names {
		p.post(t, "/v1/chat/completions", chat, "x-gateway-inference-objective", name)
		p.post(t, "/v1/embeddings", chat, "x-gateway-inference-objective", name)
	}
	require.Equal(t, 2.0, p.counter(t, "kvroute_router_sheddable_shed_total", nil), "the sheddable objective was shed on both paths")
	families, err := p.registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, names, l.GetValue(), "%s{%s}", f.GetName(), l.GetName())
			}
		}
	}
	p.requireIdle(t)
}
