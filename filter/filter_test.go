package filter_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/internal/logbuf"
)

const (
	buffered   = extprocfilterv3.ProcessingMode_BUFFERED
	streamed   = extprocfilterv3.ProcessingMode_STREAMED
	fullDuplex = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	noBody     = extprocfilterv3.ProcessingMode_NONE
)

var modes = []struct {
	name      string
	req, resp extprocfilterv3.ProcessingMode_BodySendMode
}{
	{"buffered request, streamed response", buffered, streamed},
	{"full duplex both ways", fullDuplex, fullDuplex},
	{"buffered request, no response body", buffered, noBody},
}

func chat(content string, stream bool) string {
	return fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"system","content":"You are a helpful assistant with a long, stable system prompt."},{"role":"user","content":%q}]}`, stream, content)
}

func TestRoutesChatAndCompletionsInEveryMode(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
			for _, tc := range []struct{ path, body string }{
				{"/v1/chat/completions", chat("hello", false)},
				{"/v1/chat/completions", chat("hello again", true)},
				{"/v1/completions", `{"model":"m","prompt":"Once upon a time"}`},
				{"/v1/completions?x=1", `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9]}`},
			} {
				resp, body := p.post(t, tc.path, tc.body)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				assert.NotEmpty(t, resp.Header.Get("x-served-by"))
				if strings.Contains(tc.body, `"stream":true`) {
					assert.Contains(t, body, "data: [DONE]", "SSE passes through unchanged")
					assert.Equal(t, 3, strings.Count(body, `"delta"`))
				}
			}
			for _, ex := range p.envoy.Exchanges() {
				assert.True(t, ex.RouteCacheCleared, "route cache cleared with the destination")
				require.Contains(t, ex.DynamicMetadata, "envoy.lb")
				assert.Equal(t, ex.Upstream, ex.DynamicMetadata["envoy.lb"].Fields["x-gateway-destination-endpoint"].GetStringValue(),
					"header and envoy.lb metadata name the same endpoint")
				assert.Empty(t, ex.IgnoredMutations)
			}
			p.requireIdle(t)
		})
	}
}

func TestResumedConversationReturnsToItsHolder(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
			history := `[{"role":"system","content":"` + strings.Repeat("Stable instructions. ", 30) + `"},{"role":"user","content":"turn one"}]`
			first, _ := p.post(t, "/v1/chat/completions", `{"model":"m","messages":`+history+`}`)
			holder := first.Header.Get("x-served-by")
			// Another request is in flight on the holder: a small load gap, worth less
			// than recomputing the prefix elsewhere.
			release := p.book(t, holder, 0, 3)

			resumed := strings.TrimSuffix(history, "]") + `,{"role":"assistant","content":"answer"},{"role":"user","content":"turn two"}]`
			second, _ := p.post(t, "/v1/chat/completions", `{"model":"m","messages":`+resumed+`}`)
			assert.Equal(t, holder, second.Header.Get("x-served-by"))
			release()
			p.requireIdle(t)
		})
	}
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestBadInputGetsOpenAIErrors(t *testing.T) {
	big := `{"model":"m","prompt":"` + strings.Repeat("x", 300) + `"}`
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		code   string
		param  string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, 400, "invalid_request", ""},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, "invalid_request", ""},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request", "model"},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400, "invalid_request", "messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "invalid_request", "messages"},
		{"message without role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"x"}]}`, 400, "invalid_request", "messages"},
		{"stream not a boolean", "/v1/chat/completions", `{"model":"m","stream":"sometimes","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request", "stream"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "invalid_request", "prompt"},
		{"negative token id", "/v1/completions", `{"model":"m","prompt":[1,-2]}`, 400, "invalid_request", "prompt"},
		{"empty body", "/v1/completions", ``, 400, "invalid_request", ""},
		{"over max_body_bytes", "/v1/completions", big, 413, "request_too_large", ""},
		{"model nobody serves", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "model"},
	}
	for _, m := range modes[:2] {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp, models: [][]string{{"m"}, {"m"}},
				filterCfg: func(c *filter.Config) { c.MaxBodyBytes = 256 }})
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					resp, body := p.post(t, tt.path, tt.body)
					require.Equal(t, tt.status, resp.StatusCode, body)
					assert.Equal(t, "application/json", resp.Header.Get("content-type"))
					var e openAIError
					require.NoError(t, json.Unmarshal([]byte(body), &e), body)
					assert.NotEmpty(t, e.Error.Message)
					require.NotNil(t, e.Error.Code)
					assert.Equal(t, tt.code, *e.Error.Code)
					if tt.param != "" {
						require.NotNil(t, e.Error.Param)
						assert.Equal(t, tt.param, *e.Error.Param)
					}
				})
			}
			// The server keeps serving and nothing stayed booked.
			resp, _ := p.post(t, "/v1/chat/completions", chat("still fine", false))
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			// Values of another JSON type that vLLM's pydantic models convert are served,
			// not refused (openai.laxBool, laxInt).
			resp, body := p.post(t, "/v1/chat/completions", `{"model":"m","stream":"no","max_tokens":64.0,"messages":[{"role":"user","content":"x"}]}`)
			assert.Equal(t, http.StatusOK, resp.StatusCode, body)
			p.requireIdle(t)
			served := 0
			for _, w := range p.workers {
				served += w.count()
			}
			assert.Equal(t, 2, served, "rejected requests never reached a worker; the two served did")
		})
	}
}

func TestClientSuppliedDestinationIsOverwritten(t *testing.T) {
	for _, m := range modes[:2] {
		t.Run(m.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{reqMode: m.req, respMode: m.resp})
			for _, path := range []string{"/v1/chat/completions", "/v1/models"} {
				resp, body := p.post(t, path, chat("x", false), "x-gateway-destination-endpoint", "169.254.169.254:80")
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
			}
			for _, ex := range p.envoy.Exchanges() {
				assert.NotEqual(t, "169.254.169.254:80", ex.Upstream)
			}
			p.requireIdle(t)
		})
	}
}

func TestNonRoutableRequestsGoToTheLeastLoadedWorker(t *testing.T) {
	p := newPlane(t, planeOptions{})
	client := p.envoy.Client()
	get := func() string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, p.envoy.URL+"/v1/models", nil)
		resp, err := client.Do(req)
		require.NoError(t, err)
		// Read to its end: the data plane passes the response's headers on as soon as
		// their reply is applied (as Envoy does), and the booking is released at the
		// response's end, before its last bytes reach the client.
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp.Header.Get("x-served-by")
	}
	for busy, idle := range map[string]string{"w0": "w1", "w1": "w0"} {
		release := p.book(t, busy, 0, 10)
		for range 3 {
			assert.Equal(t, idle, get(), "%s has 10 blocks in flight", busy)
		}
		release()
	}
	p.requireIdle(t)
	assert.Equal(t, 6.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
}

func TestSubsetHintRestrictsCandidates(t *testing.T) {
	var target string
	p := newPlane(t, planeOptions{workers: 3, envoyCfg: func(c *envoytest.Config) {
		c.ForwardingNamespaces = []string{"envoy.lb.subset_hint"}
	}})
	target = p.workers[2].address()
	p.envoy.Config.Routes = []envoytest.Route{{PathPrefix: "/v1/", DynamicMetadata: map[string]map[string]any{
		"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": []any{target}},
	}}}
	for i := range 3 {
		resp, _ := p.post(t, "/v1/chat/completions", chat(fmt.Sprint("q", i), false))
		assert.Equal(t, "w2", resp.Header.Get("x-served-by"))
	}
	p.envoy.Config.Routes[0].DynamicMetadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"] = []any{"10.9.9.9:1"}
	resp, body := p.post(t, "/v1/chat/completions", chat("none eligible", false))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	p.requireIdle(t)
}

// The subset hint may come as one comma-separated string (a data plane that copies a
// header into the metadata) or as list entries that are themselves comma-separated:
// GIE's reference picker reads both (pkg/lwepp/handlers/request.go). kvroute read only
// a list of single entries, so a string hint admitted no worker and every request got
// a 503.
func TestSubsetHintAsCommaSeparatedString(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 3, envoyCfg: func(c *envoytest.Config) {
		c.ForwardingNamespaces = []string{"envoy.lb.subset_hint"}
	}})
	allowed := map[string]bool{"w1": true, "w2": true}
	for _, hint := range []any{
		p.workers[1].address() + ", " + p.workers[2].address(),
		[]any{p.workers[1].address() + "," + p.workers[2].address()},
	} {
		p.envoy.Config.Routes = []envoytest.Route{{PathPrefix: "/v1/", DynamicMetadata: map[string]map[string]any{
			"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": hint},
		}}}
		for i := range 4 {
			resp, body := p.post(t, "/v1/chat/completions", chat(fmt.Sprint("q", i), false))
			require.Equal(t, http.StatusOK, resp.StatusCode, "hint %#v: %s", hint, body)
			assert.True(t, allowed[resp.Header.Get("x-served-by")], "hint %#v: served by %s", hint, resp.Header.Get("x-served-by"))
		}
	}
	p.requireIdle(t)
}

func TestFallbackEndpointsListInHeaderAndMetadata(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 3, filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 2 }})
	resp, _ := p.post(t, "/v1/chat/completions", chat("x", false))
	// ORIGINAL_DST reads one literal ip:port: a list finds no host (envoytest models it).
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	ex := p.envoy.Exchanges()[0]
	list := ex.DynamicMetadata["envoy.lb"].Fields["x-gateway-destination-endpoint"].GetStringValue()
	assert.Len(t, strings.Split(list, ","), 3, "chosen worker then two fallbacks")
	// The data plane answered 503 itself and closed the stream: kvroute releases on the
	// stream's end, which may come after the client has its answer.
	p.waitIdle(t)
}

func TestPerRoutePolicyOverride(t *testing.T) {
	// Two workers; the holder of a long prompt is made busy. With the default cost the
	// resumed prompt moves; the /sticky route's override (α = 4) keeps it on the holder.
	p := newPlane(t, planeOptions{envoyCfg: func(c *envoytest.Config) {
		c.Routes = []envoytest.Route{{PathPrefix: "/sticky/", GRPCInitialMetadata: map[string]string{
			filter.PolicyMetadataKey: `{"prefix_affinity_weight": 4}`,
		}}}
	}, filterCfg: func(c *filter.Config) {
		c.ChatPaths = []string{"/v1/chat/completions", "/sticky/v1/chat/completions"}
	}})
	prompt, holder, release := busyHolder(t, p)
	// The sticky route goes first: in approximate mode a moved request makes its new
	// worker a holder too.
	kept, _ := p.post(t, "/sticky/v1/chat/completions", chat(prompt+" more", false))
	moved, _ := p.post(t, "/v1/chat/completions", chat(prompt+" more", false))
	assert.NotEqual(t, holder, moved.Header.Get("x-served-by"), "default cost moves the session")
	assert.Equal(t, holder, kept.Header.Get("x-served-by"), "the route's override keeps it")
	release()
	p.requireIdle(t)

	t.Run("an invalid override is a 500 naming the field", func(t *testing.T) {
		p.envoy.Config.Routes[0].GRPCInitialMetadata[filter.PolicyMetadataKey] = `{"prefix_affinity_weight": -1}`
		resp, body := p.post(t, "/sticky/v1/chat/completions", chat("x", false))
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		assert.Contains(t, body, "policy.prefix_affinity_weight")
		p.envoy.Config.Routes[0].GRPCInitialMetadata[filter.PolicyMetadataKey] = `{"shared_prefix_affinity": 2}`
		resp, body = p.post(t, "/sticky/v1/chat/completions", chat("x", false))
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		assert.Contains(t, body, "policy.shared_prefix_affinity")
		p.envoy.Config.Routes[0].GRPCInitialMetadata[filter.PolicyMetadataKey] = `{"unknown_key": 1}`
		resp, body = p.post(t, "/sticky/v1/chat/completions", chat("x", false))
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		assert.Contains(t, body, "unknown_key")
	})
}

// busyHolder sends a long prompt, then loads the worker that holds it with 60 in-flight
// blocks on unrelated prompts: more than the ~43-block prompt's prefill (the default
// cost moves the session), less than α=4 × 43 (prefix_affinity_weight 4 keeps it).
func busyHolder(t *testing.T, p *plane) (prompt, holder string, release func()) {
	t.Helper()
	prompt = strings.Repeat("shared context ", 40)
	first, _ := p.post(t, "/v1/chat/completions", chat(prompt, false))
	holder = first.Header.Get("x-served-by")
	var busy []func()
	for i := range 3 {
		busy = append(busy, p.book(t, holder, i, 20))
	}
	return prompt, holder, func() {
		for _, r := range busy {
			r()
		}
	}
}

func TestBodyModesFromConfigWhenEnvoyDoesNotAnnounceThem(t *testing.T) {
	// Envoy < 1.34 sends no protocol_config: kvroute takes the modes from its config,
	// which must name the modes of the Envoy filter.
	p := newPlane(t, planeOptions{reqMode: fullDuplex, respMode: fullDuplex, noProtocol: true})
	resp, body := p.post(t, "/v1/chat/completions", chat("hello", true))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "[DONE]")
	assert.Nil(t, p.envoy.Exchanges()[0].Sent[0].GetProtocolConfig())
	p.requireIdle(t)
}

func TestLargeFullDuplexBodyIsEchoedInBoundedChunks(t *testing.T) {
	p := newPlane(t, planeOptions{reqMode: fullDuplex, respMode: fullDuplex})
	prompt := strings.Repeat("a long document line. ", 9000) // ~200 KB
	resp, body := p.post(t, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, prompt))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	ex := p.envoy.Exchanges()[0]
	echoed := 0
	for _, r := range ex.Received {
		if sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
			assert.LessOrEqual(t, len(sr.GetBody()), 62_000)
			echoed += len(sr.GetBody())
		}
	}
	assert.Greater(t, echoed, 62_000*3, "the whole body came back, in several chunks")
	served := p.workers[0].Served()
	if len(served) == 0 {
		served = p.workers[1].Served()
	}
	require.Len(t, served, 1)
	assert.Contains(t, string(served[0].Body), prompt, "the worker got the body intact")
	p.requireIdle(t)
}

func TestDecisionTraceAtDebugLevel(t *testing.T) {
	logs := &logbuf.Buffer{}
	plane := newPlane(t, planeOptions{logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	resp, _ := plane.post(t, "/v1/chat/completions", chat("trace me", false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.Split(strings.TrimSpace(logs.String()), "\n")[0]), &line))
	assert.Equal(t, "routed", line["msg"])
	assert.Equal(t, resp.Header.Get("x-served-by"), line["worker"])
	decision, ok := line["decision"].(map[string]any)
	require.True(t, ok, "the trace is explain's schema")
	candidates, ok := decision["candidates"].([]any)
	require.True(t, ok)
	require.Len(t, candidates, 2, "one entry per candidate")
	for _, c := range candidates {
		for _, term := range []string{"worker", "address", "overlap", "prefill_tokens", "active_blocks", "new_blocks", "active_requests",
			"pending_requests", "max_num_seqs", "shared_blocks", "shared_missing", "queued",
			"prefill", "requests", "affinity", "pressure", "queue", "interference", "session", "cost"} {
			assert.Contains(t, c, term)
		}
	}
}
