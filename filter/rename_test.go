package filter_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/rewrite"
)

// splitter cuts a worker's responses at a chosen offset from an occurrence of a field,
// and holds the rest back until the data plane has sent the processor the first piece
// (counted from the response's headers on), so that the two pieces are two messages.
type splitter struct {
	field string
	last  atomic.Bool  // cut at the field's last occurrence, else its first
	at    atomic.Int64 // offset into the field; -1: do not cut
	mu    sync.Mutex
	sent  int // response body bytes sent to the processor
	cond  *sync.Cond
	body  []byte // the last body the worker answered
}

func newSplitter(field string) *splitter {
	s := &splitter{field: field}
	s.cond = sync.NewCond(&s.mu)
	s.at.Store(-1)
	return s
}

func (s *splitter) cut(body []byte) int {
	s.mu.Lock()
	s.body = append([]byte(nil), body...)
	s.mu.Unlock()
	at := s.at.Load()
	if at < 0 {
		return 0
	}
	i := strings.Index(string(body), s.field)
	if s.last.Load() {
		i = strings.LastIndex(string(body), s.field)
	}
	return i + int(at)
}

func (s *splitter) wait(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.sent < n {
		s.cond.Wait()
	}
}

func (s *splitter) onMessage(_ string, msg *extprocv3.ProcessingRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case msg.GetResponseHeaders() != nil:
		s.sent = 0
	case msg.GetResponseBody() != nil:
		s.sent += len(msg.GetResponseBody().GetBody())
		s.cond.Broadcast()
	}
}

func (s *splitter) lastBody() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.body)
}

// A rewritten request's response names the model the client asked for, not its target,
// in the top-level "model" of a whole JSON body and of every event of a stream, in
// every response body mode where kvroute sees the body: the value cut by a chunk
// boundary anywhere (STREAMED and FULL_DUPLEX_STREAMED; BUFFERED gets the body whole,
// and its content-length follows the renamed body, which the data plane checks as Envoy
// does). Generated text naming the target keeps it, and the usage is read as before. In
// response body mode NONE the body is the engine's.
func TestModelRewriteGivesTheResponseTheClientsModel(t *testing.T) {
	const field = `"model":"small-v1"`
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_NONE,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			split := newSplitter(field)
			table := rewrite.NewTable(rewrite.Config{
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
			}, &draws{}, nil)
			p := newPlane(t, planeOptions{
				workers: 1, models: [][]string{{"small-v1"}},
				reqMode: extprocfilterv3.ProcessingMode_BUFFERED, respMode: mode,
				rewrites: table,
				envoyCfg: func(c *envoytest.Config) { c.OnProcessorMessage = split.onMessage },
			})
			p.workers[0].SplitResponses(split.cut, split.wait)
			renamed := mode != extprocfilterv3.ProcessingMode_NONE
			cuts := []int{-1}
			if mode != extprocfilterv3.ProcessingMode_BUFFERED && renamed {
				// Envoy sends the BUFFERED body whole: no cut reaches kvroute.
				for k := range len(field) + 1 {
					cuts = append(cuts, k)
				}
			}
			requests := 0
			for _, stream := range []bool{false, true} {
				for _, last := range []bool{false, true} {
					if last && !stream {
						continue // a whole body has one model
					}
					split.last.Store(last)
					for _, k := range cuts {
						split.at.Store(int64(k))
						body := `{"model":"small","messages":[{"role":"user","content":"ECHO_MODEL"}],"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
						resp, got := p.post(t, "/v1/chat/completions", body)
						requests++
						require.Equal(t, http.StatusOK, resp.StatusCode, got)
						sent := split.lastBody()
						want := sent
						if renamed {
							want = strings.ReplaceAll(sent, field, `"model":"small"`)
						}
						require.Equal(t, want, got, "stream %v, last %v, cut at %d", stream, last, k)
						if renamed {
							assert.Contains(t, got, `{\"model\":\"small-v1\"}`, "the generated text keeps the target's name")
							assert.NotContains(t, got, field)
						}
					}
				}
			}
			split.at.Store(-1)
			if renamed {
				assert.Equal(t, float64(10*requests), p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil), "every usage read")
			}
			p.requireIdle(t)
		})
	}
}

// The response of a request that was not rewritten, an error's body and a compressed
// body (content-encoding gzip, which kvroute does not decode) reach the client as the
// worker sent them.
func TestModelRewriteLeavesOtherResponsesAlone(t *testing.T) {
	for _, mode := range []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		extprocfilterv3.ProcessingMode_BUFFERED,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			split := newSplitter(`"model"`)
			table := rewrite.NewTable(rewrite.Config{
				{Name: "alias", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "small-v1"}}}}},
			}, &draws{}, nil)
			p := newPlane(t, planeOptions{
				workers: 1, models: [][]string{{"small-v1", "other"}},
				reqMode: extprocfilterv3.ProcessingMode_BUFFERED, respMode: mode, rewrites: table,
			})
			p.workers[0].SplitResponses(split.cut, split.wait)

			resp, got := p.post(t, "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, split.lastBody(), got, "not rewritten")

			resp, got = p.post(t, "/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"FAIL_UPSTREAM"}]}`)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.JSONEq(t, `{"error":{"message":"engine overloaded","type":"server_error","param":null,"code":null}}`, got)

			resp, got = p.post(t, "/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"GZIP_RESPONSE"}]}`)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.True(t, resp.Uncompressed, "the client decoded the gzip body")
			var body struct{ Model string }
			require.NoError(t, json.Unmarshal([]byte(got), &body), got)
			assert.Equal(t, "small-v1", body.Model, "a compressed body is not renamed")
			p.requireIdle(t)
		})
	}
}
