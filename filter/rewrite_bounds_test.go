package filter_test

import (
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/rewrite"
)

// A rewrite costs at most one copy of the body and one of the target's name, whatever
// the client sends:
//   - a body giving "model" more than once is the client's 400 when it would be
//     rewritten: each copy would take the target (up to 3,074 bytes as JSON, a 512-byte
//     name of '<'), so a body of 10-byte "model":0, members grew some 300 times, and
//     max_body_bytes of them took gigabytes;
//   - a body whose model no model could have (over 512 bytes, control characters) is
//     not rewritten, by a rule or by the header: its response would have each
//     event's model replaced by that name (a client's 4 KiB name sent back once per
//     streamed token). It is routed on its own model, which no worker serves (404).
func TestModelRewriteBoundsWhatItCopies(t *testing.T) {
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			table := rewrite.NewTable(rewrite.Config{
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
				{Name: "default", Rules: []rewrite.Rule{{Targets: []rewrite.Target{{Model: "small-v1"}}}}},
			}, &draws{}, nil)
			p := newPlane(t, planeOptions{workers: 1, models: [][]string{{"small-v1"}}, reqMode: mode,
				respMode: extprocfilterv3.ProcessingMode_STREAMED, rewrites: table})

			dup := `{` + strings.Repeat(`"model":"small",`, 200) + `"prompt":"hi","stream":true}`
			resp, got := p.post(t, "/v1/completions", dup)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a rule's target: %.200s", got)
			assert.Contains(t, got, "more than once")
			resp, got = p.post(t, "/v1/completions", strings.ReplaceAll(dup, "small", "other"), rewrite.Header, "small-v1")
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "the header's target: %.200s", got)

			long := strings.Repeat("x", 4096)
			for _, header := range []string{"", "small-v1"} {
				resp, got = p.post(t, "/v1/completions", `{"model":"`+long+`","prompt":"hi","stream":true}`, rewrite.Header, header)
				assert.Equal(t, http.StatusNotFound, resp.StatusCode, "header %q: %.200s", header, got)
			}
			require.Zero(t, p.workers[0].count(), "no worker was sent any of them")

			resp, got = p.post(t, "/v1/completions", `{"model":"small","prompt":"hi"}`)
			assert.Equal(t, http.StatusOK, resp.StatusCode, got)
			assert.Contains(t, got, `"model":"small"`)
			p.requireIdle(t)
		})
	}
}
