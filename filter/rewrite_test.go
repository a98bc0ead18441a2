package filter_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/rewrite"
)

// draws is a rewrite.Rand that returns its values in turn, each modulo n.
type draws struct{ values []int64 }

func (d *draws) next() int64 {
	v := d.values[0]
	d.values = d.values[1:]
	return v
}
func (d *draws) IntN(n int) int       { return int(d.next() % int64(n)) }
func (d *draws) Int64N(n int64) int64 { return d.next() % n }

// A request for an aliased or split model is routed on its target, among the workers
// serving the target alone, and reaches the worker with the target in its body, every
// other byte as the client sent it, in both body modes kvroute reads: BUFFERED (the body
// replaced, with its content-length, which the test data plane checks as Envoy does)
// and FULL_DUPLEX_STREAMED (the echoed body). A request no rewrite matches, or whose
// draw keeps its own model, reaches its worker byte for byte.
func TestModelRewriteRoutesOnTheTargetAndForwardsIt(t *testing.T) {
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			// Weights 3 and 1 over canary: draws 0 and 3 pick big-v1, then big-v2; 1
			// keeps "stay" on itself.
			table := rewrite.NewTable(rewrite.Config{
				{Name: "canary", Rules: []rewrite.Rule{{Models: []string{"big"}, Targets: []rewrite.Target{{Model: "big-v1", Weight: 3}, {Model: "big-v2", Weight: 1}}}}},
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
				{Name: "keep", Rules: []rewrite.Rule{{Models: []string{"stay"}, Targets: []rewrite.Target{{Model: "gone"}, {Model: "stay"}}}}},
			}, &draws{values: []int64{0, 3, 1}}, nil)
			p := newPlane(t, planeOptions{
				workers:  4,
				models:   [][]string{{"big-v1"}, {"big-v2"}, {"small-v1"}, {"stay", "other"}},
				reqMode:  mode,
				respMode: extprocfilterv3.ProcessingMode_STREAMED,
				rewrites: table,
				explain:  explain.Config{Enabled: true, Header: explain.DefaultConfig().Header, Buffer: 1},
			})
			const messages = `"messages": [{"role":"user","content":"a prompt long enough for a few blocks of four tokens"}] ,"max_tokens":8}`
			tests := []struct {
				model, sent, wantWorker, wantRewrite string
			}{
				{"big", "{\"model\" : \"big\",\n " + messages, "w0", "canary"},
				{"big", `{"stream":false,"model":"big",` + messages, "w1", "canary"},
				{"small", `{"model":"small",` + messages, "w2", "alias"},
				{"stay", `{ "model": "stay", ` + messages, "w3", "keep"}, // drawn itself: untouched
				{"other", `{"model":  "other",` + messages, "w3", ""},    // no rule: untouched
			}
			for _, tt := range tests {
				resp, _ := p.post(t, "/v1/chat/completions", tt.sent, explain.DefaultConfig().Header, "1")
				require.Equal(t, http.StatusOK, resp.StatusCode, tt.sent)
				assert.Equal(t, tt.wantWorker, resp.Header.Get("x-served-by"), tt.sent)
				var trace explain.Trace
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &trace))
				if tt.wantRewrite == "" {
					assert.Nil(t, trace.Rewrite)
				} else {
					assert.Equal(t, &explain.RewriteTrace{Name: tt.wantRewrite, From: tt.model}, trace.Rewrite)
				}
			}
			p.requireIdle(t)

			served := func(worker int) []string {
				var out []string
				for _, s := range p.workers[worker].Served() {
					out = append(out, string(s.Body))
				}
				return out
			}
			assert.Equal(t, []string{"{\"model\" : \"big-v1\",\n " + messages}, served(0), "only the model's value changed")
			assert.Equal(t, []string{`{"stream":false,"model":"big-v2",` + messages}, served(1))
			assert.Equal(t, []string{`{"model":"small-v1",` + messages}, served(2))
			assert.Equal(t, []string{tests[3].sent, tests[4].sent}, served(3), "byte for byte")
			for _, w := range p.workers {
				for _, s := range w.Served() {
					assert.False(t, strings.Contains(string(s.Body), `"big"`) || strings.Contains(string(s.Body), `"small"`))
				}
			}
		})
	}
}

// Without a match the whole request is as without rewrites: a model no worker serves is
// the client's 404, and kvroute's rewrites do not count it.
func TestModelRewriteLeavesUnmatchedModelsAlone(t *testing.T) {
	table := rewrite.NewTable(rewrite.Config{
		{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
	}, &draws{}, nil)
	p := newPlane(t, planeOptions{workers: 1, models: [][]string{{"small-v1"}}, rewrites: table})
	resp, _ := p.post(t, "/v1/chat/completions", `{"model":"small-v1","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the target itself is served as asked")
	resp, _ = p.post(t, "/v1/chat/completions", `{"model":"medium","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	p.requireIdle(t)
}
