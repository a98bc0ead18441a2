package filter_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/rewrite"
)

// postHeaders posts body with headers, each value added in order (a name may repeat),
// and returns the status and the body of the answer.
func (p *plane) postHeaders(t *testing.T, path, body string, headers [][2]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.envoy.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	resp, err := p.envoy.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(out)
}

// The objective header is llm-d-router's x-llm-d-inference-objective, then GIE's
// x-gateway-inference-objective, its deprecated alias, as llm-d-router reads them
// (metadata.GetLowerCaseHeaderValue): the first name present counts, with its last
// value. A config naming either reads both; one naming another header reads it alone.
func TestTheObjectiveHeaderAndItsAlias(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	const llmd, gie = "x-llm-d-inference-objective", "x-gateway-inference-objective"
	tests := []struct {
		name    string
		header  string // priority.header
		headers [][2]string
		want    string
	}{
		{"the default, llm-d-router's name", llmd, [][2]string{{llmd, "chat"}}, "chat"},
		{"the default, GIE's name", llmd, [][2]string{{gie, "batch"}}, "batch"},
		{"both: the new name first", llmd, [][2]string{{gie, "batch"}, {llmd, "chat"}}, "chat"},
		{"the new name's last value", llmd, [][2]string{{llmd, "chat"}, {llmd, "batch"}, {gie, "chat"}}, "batch"},
		{"the new name present but unusable: no fall back", llmd, [][2]string{{llmd, "two words"}, {gie, "batch"}}, ""},
		{"GIE's name configured reads both", gie, [][2]string{{llmd, "chat"}}, "chat"},
		{"a custom header is read alone", "x-objective", [][2]string{{llmd, "chat"}, {gie, "chat"}}, ""},
		{"a custom header", "x-objective", [][2]string{{"x-objective", "batch"}}, "batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &requestRecorder{}
			p := newPlane(t, planeOptions{objectiveHeader: tt.header, wrapRouter: func(r filter.Router) filter.Router { rec.Router = r; return rec }})
			resp, _ := p.postHeaders(t, "/v1/chat/completions", chat, tt.headers)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.NotNil(t, rec.last)
			assert.Equal(t, tt.want, rec.last.Objective)
			p.requireIdle(t)
		})
	}
}

// The model-name rewrite header (llm-d-router's x-llm-d-model-name-rewrite, then GIE's
// x-gateway-model-name-rewrite) sets a request's target model, and a model rewrite
// matching the body's model overrides it, as llm-d-router's director does
// (modelRewriteIfNeeded, applyWeightedModelRewrite): the request is routed on the
// target and forwarded with it, the body changed only when the target differs. The
// trace says which header named the target. Before, kvroute ignored the header.
func TestTheModelNameRewriteHeaderSetsTheTarget(t *testing.T) {
	const llmd, gie = rewrite.Header, rewrite.LegacyHeader
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			table := rewrite.NewTable(rewrite.Config{
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
			}, &draws{}, nil)
			p := newPlane(t, planeOptions{
				workers:  3,
				models:   [][]string{{"big-v1"}, {"small-v1"}, {"other"}},
				reqMode:  mode,
				respMode: extprocfilterv3.ProcessingMode_STREAMED,
				rewrites: table,
				explain:  explain.Config{Enabled: true, Header: explain.DefaultConfig().Header, Buffer: 1},
			})
			const messages = `"messages": [{"role":"user","content":"a prompt long enough for a few blocks of four tokens"}]}`
			explainOn := [2]string{explain.DefaultConfig().Header, "1"}
			tests := []struct {
				name       string
				model      string // the body's
				headers    [][2]string
				wantWorker string
				want       *explain.RewriteTrace
				wantModel  string // in the body the worker got
			}{
				{"the header names the target", "other", [][2]string{{llmd, "big-v1"}}, "w0", &explain.RewriteTrace{Header: llmd, From: "other"}, "big-v1"},
				{"GIE's name", "other", [][2]string{{gie, "big-v1"}}, "w0", &explain.RewriteTrace{Header: gie, From: "other"}, "big-v1"},
				{"a rule matching the body's model wins", "small", [][2]string{{llmd, "big-v1"}}, "w1", &explain.RewriteTrace{Name: "alias", From: "small"}, "small-v1"},
				{"the new name first; its target is the body's model: untouched", "other", [][2]string{{gie, "big-v1"}, {llmd, "other"}}, "w2", &explain.RewriteTrace{Header: llmd, From: "other"}, "other"},
				{"the last value", "other", [][2]string{{llmd, "small-v1"}, {llmd, "big-v1"}}, "w0", &explain.RewriteTrace{Header: llmd, From: "other"}, "big-v1"},
				{"a value no model could have names none", "other", [][2]string{{llmd, strings.Repeat("m", rewrite.MaxModelBytes+1)}}, "w2", nil, "other"},
				{"no header", "other", nil, "w2", nil, "other"},
			}
			for i, tt := range tests {
				sent := `{"model": "` + tt.model + `", ` + messages
				resp, body := p.postHeaders(t, "/v1/chat/completions", sent, append(tt.headers, explainOn))
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tt.name, body)
				assert.Equal(t, tt.wantWorker, resp.Header.Get("x-served-by"), tt.name)
				var trace explain.Trace
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
				assert.Equal(t, tt.want, trace.Rewrite, tt.name)
				served := p.workers[map[string]int{"w0": 0, "w1": 1, "w2": 2}[tt.wantWorker]].Served()
				require.NotEmpty(t, served, tt.name)
				assert.Equal(t, `{"model": "`+tt.wantModel+`", `+messages, string(served[len(served)-1].Body), "%d %s: only the model's value changes", i, tt.name)
			}
			p.requireIdle(t)
		})
	}
}

// A header naming a model no worker serves gets the answer a body naming it gets: the
// 404 model_not_found. The header's value is the client's: it never becomes a metric
// label.
func TestAModelNameRewriteHeaderNoWorkerServesIsA404(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 1, models: [][]string{{"served"}}})
	viaHeader, headerBody := p.postHeaders(t, "/v1/chat/completions", `{"model":"served","messages":[{"role":"user","content":"x"}]}`,
		[][2]string{{rewrite.Header, "client-made-up"}})
	viaBody, bodyBody := p.postHeaders(t, "/v1/chat/completions", `{"model":"client-made-up","messages":[{"role":"user","content":"x"}]}`, nil)
	assert.Equal(t, http.StatusNotFound, viaHeader.StatusCode)
	assert.Equal(t, viaBody.StatusCode, viaHeader.StatusCode)
	assert.JSONEq(t, bodyBody, headerBody)
	assert.Contains(t, headerBody, "model_not_found")
	assert.Empty(t, p.workers[0].Served())

	p.postHeaders(t, "/v1/chat/completions", `{"model":"x","messages":[{"role":"user","content":"x"}]}`, [][2]string{{rewrite.Header, "served"}})
	families, err := p.registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, []string{"client-made-up", "served"}, l.GetValue(), "%s{%s}", f.GetName(), l.GetName())
			}
		}
	}
	p.requireIdle(t)
}
