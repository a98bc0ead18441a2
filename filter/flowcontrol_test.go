package filter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/router"
)

// The fairness header names the request's flow for flow control, whether the request
// is routed by its body or by load alone: the default header or GIE's alias (the
// default's value when both come), or the configured header alone; a value no
// fairness id could have names none (the flow of requests naming none).
func TestFairnessHeaderNamesTheRequestsFlow(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	def, legacy := flowcontrol.DefaultFairnessHeader, flowcontrol.LegacyFairnessHeader
	tests := []struct {
		name   string
		header string // the filter's fairness header
		path   string
		sent   []string // header, value pairs
		want   string
	}{
		{"the default header", def, "/v1/chat/completions", []string{def, "tenant-a"}, "tenant-a"},
		{"GIE's alias, read with the default", def, "/v1/chat/completions", []string{legacy, "tenant-b"}, "tenant-b"},
		{"both: the default's value", def, "/v1/chat/completions", []string{legacy, "tenant-b", def, "tenant-a"}, "tenant-a"},
		{"routed by load alone", def, "/v1/embeddings", []string{def, "tenant-a"}, "tenant-a"},
		{"a configured header", "x-tenant", "/v1/chat/completions", []string{"x-tenant", "tenant-c"}, "tenant-c"},
		{"a configured header replaces the default", "x-tenant", "/v1/chat/completions", []string{def, "tenant-a"}, ""},
		{"no header", def, "/v1/chat/completions", nil, ""},
		{"longer than a fairness id", def, "/v1/chat/completions", []string{def, strings.Repeat("a", flowcontrol.MaxFairnessIDBytes+1)}, ""},
		{"not visible ASCII", def, "/v1/chat/completions", []string{def, "tenant a"}, ""},
		{"the header off", "", "/v1/chat/completions", []string{def, "tenant-a"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &requestRecorder{}
			p := newPlane(t, planeOptions{fairnessHeader: tt.header, wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
			resp, _ := p.post(t, tt.path, chat, tt.sent...)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NotNil(t, rec.last)
			assert.Equal(t, tt.want, rec.last.FairnessID)
			p.requireIdle(t)
		})
	}
}

// refuser refuses every request with err.
type refuser struct{ err error }

func (r refuser) Route(context.Context, *router.Request) (*router.Decision, error) { return nil, r.err }

// Flow control's refusals (max_wait passed, the queue full) get the 429 with
// retry-after that the router's refusals for capacity get, in the API's error shape,
// counted as rate_limit_exceeded.
func TestFlowControlRefusalsAre429sWithRetryAfter(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	const messages = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name        string
		err         error
		path, body  string
		wantMessage string
	}{
		{"max_wait passed", flowcontrol.ErrTimedOut, "/v1/chat/completions", chat, "while it was queued"},
		{"the queue full", flowcontrol.ErrQueueFull, "/v1/chat/completions", chat, "the queue is full"},
		{"max_wait passed, Anthropic's shape", flowcontrol.ErrTimedOut, "/v1/messages", messages, "while it was queued"},
		{"the queue full, Anthropic's shape", flowcontrol.ErrQueueFull, "/v1/messages", messages, "the queue is full"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{wrapRouter: func(filter.Router) filter.Router { return refuser{tt.err} }})
			resp, body := p.post(t, tt.path, tt.body)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
			assert.Equal(t, "1", resp.Header.Get("retry-after"))
			if strings.HasPrefix(tt.path, "/v1/messages") {
				var e anthropicError
				require.NoError(t, json.Unmarshal([]byte(body), &e), body)
				assert.Equal(t, "error", e.Type, body)
				assert.Equal(t, "rate_limit_error", e.Error.Type, body)
				assert.Contains(t, e.Error.Message, tt.wantMessage)
			} else {
				var e struct {
					Error struct{ Message, Type, Code string }
				}
				require.NoError(t, json.Unmarshal([]byte(body), &e), body)
				assert.Equal(t, "rate_limit_exceeded", e.Error.Code)
				assert.Equal(t, "requests", e.Error.Type)
				assert.Contains(t, e.Error.Message, tt.wantMessage)
			}
			assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "rate_limit_exceeded"}))
			p.requireIdle(t)
		})
	}
}
