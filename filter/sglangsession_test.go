package filter_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
)

// sglangSessionRequests reads kvroute_router_sglang_session_requests_total by its
// routed label.
func (p *plane) sglangSessionRequests(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, routed := range []string{"stored_worker", "unknown", "not_candidate"} {
		out[routed] = p.counter(t, "kvroute_router_sglang_session_requests_total", map[string]string{"routed": routed})
	}
	return out
}

// openSGLangSession opens a session through the data plane and returns its id and the
// worker that opened it.
func (p *plane) openSGLangSession(t *testing.T, method, body string) (id, worker string) {
	t.Helper()
	req, err := http.NewRequest(method, p.envoy.URL+"/open_session", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := p.envoy.Client().Do(req)
	require.NoError(t, err)
	// Read to its end before the body is closed: closing it early cancels the stream,
	// whose booking is then released after the test's check.
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", answer)
	require.NoError(t, json.Unmarshal(answer, &id))
	return id, resp.Header.Get("x-served-by")
}

// TestSGLangSessionTurnsGoToTheEngineThatOpenedIt: SGLang keeps a session in the memory
// of the engine that opened it, and every other engine refuses its turns (the fake
// workers as SGLang). kvroute reads the id each /open_session answer gives, in every
// body mode that shows it the response, and sends the session's turns and its
// /close_session there, even when that worker is the busiest.
func TestSGLangSessionTurnsGoToTheEngineThatOpenedIt(t *testing.T) {
	const B, FD, S = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_STREAMED
	for _, modes := range [][2]extprocfilterv3.ProcessingMode_BodySendMode{{B, S}, {B, B}, {FD, FD}, {B, FD}, {FD, S}} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s_%s_stream=%v", modes[0], modes[1], stream), func(t *testing.T) {
				cfg := explain.DefaultConfig()
				cfg.Enabled = true
				p := newPlane(t, planeOptions{workers: 3, responses: true, reqMode: modes[0], respMode: modes[1], explain: cfg,
					filterCfg: func(c *filter.Config) { c.DefaultModel = "m" }})
				id, holder := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":1000}`)
				// By load, every turn would go to another worker.
				release := p.book(t, holder, 0, 8)
				for turn := range 4 {
					body := fmt.Sprintf(`{"text":"turn %d","session_params":{"id":%q},"sampling_params":{"max_new_tokens":8},"stream":%v}`, turn, id, stream)
					resp, out := p.post(t, "/generate", body, "x-kvroute-explain", "1")
					require.Equal(t, http.StatusOK, resp.StatusCode, "turn %d: %s", turn, out)
					assert.NotContains(t, out, "does not exist", "turn %d", turn)
					assert.Equal(t, holder, resp.Header.Get("x-served-by"), "turn %d", turn)
					assert.Contains(t, resp.Header.Get(explain.ResponseHeader), `"sglang_session":"stored_worker"`, "the trace says why")
				}
				resp, out := p.post(t, "/close_session", fmt.Sprintf(`{"session_id":%q}`, id))
				require.Equal(t, http.StatusOK, resp.StatusCode, out)
				assert.Equal(t, holder, resp.Header.Get("x-served-by"))
				for _, w := range p.workers {
					assert.Zero(t, w.SGLangSessions(), "%s: the session was closed where it was open", w.Name)
				}
				release()
				p.requireIdle(t)
				assert.Equal(t, map[string]float64{"stored_worker": 5, "unknown": 0, "not_candidate": 0}, p.sglangSessionRequests(t))
				// A turn's ids are only the tail of the engine's prompt: routed by load on its
				// engine, as the README says, and counted so.
				assert.Equal(t, 4.0, p.counter(t, "kvroute_router_prompt_fallbacks_total", map[string]string{"reason": "unsupported_content"}))
			})
		}
	}
}

// TestSGLangSessionIdsAreLearnedFromEveryOpen: the id is the engine's answer, whether
// the client chose it or the engine did, and whatever the method SGLang takes.
func TestSGLangSessionIdsAreLearnedFromEveryOpen(t *testing.T) {
	for _, tt := range []struct{ name, method, body, want string }{
		{"the engine's id", http.MethodPost, `{"capacity_of_str_len":10}`, ""},
		{"the client's id, echoed", http.MethodPost, `{"capacity_of_str_len":10,"session_id":"my-agent-7"}`, "my-agent-7"},
		{"GET, as SGLang takes it", http.MethodGet, `{"capacity_of_str_len":10}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 3, responses: true})
			id, holder := p.openSGLangSession(t, tt.method, tt.body)
			if tt.want != "" {
				assert.Equal(t, tt.want, id)
			}
			release := p.book(t, holder, 0, 8)
			resp, out := p.post(t, "/generate", fmt.Sprintf(`{"input_ids":[1,2,3],"session_params":{"id":%q}}`, id), "x-gateway-model-name", "m")
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			assert.Equal(t, holder, resp.Header.Get("x-served-by"))
			release()
			p.requireIdle(t)
		})
	}
}

// TestSGLangSessionsKvrouteDidNotSeeOpenAreRoutedByLoad: a session whose opening
// kvroute did not read (the answer not shown to it, an open the engine refused, the
// open paths off) is routed by load, and counted so; a refused open teaches nothing.
func TestSGLangSessionsKvrouteDidNotSeeOpenAreRoutedByLoad(t *testing.T) {
	for _, tt := range []struct {
		name     string
		respMode extprocfilterv3.ProcessingMode_BodySendMode
		cfg      func(*filter.Config)
	}{
		{"answer not shown to kvroute", extprocfilterv3.ProcessingMode_NONE, nil},
		{"sglang_open_session_paths off", extprocfilterv3.ProcessingMode_STREAMED, func(c *filter.Config) { c.SGLangOpenSessionPaths = nil }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 3, responses: true, reqMode: extprocfilterv3.ProcessingMode_BUFFERED, respMode: tt.respMode, filterCfg: tt.cfg})
			id, _ := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10}`)
			p.post(t, "/generate", fmt.Sprintf(`{"text":"t","session_params":{"id":%q}}`, id), "x-gateway-model-name", "m")
			p.post(t, "/close_session", fmt.Sprintf(`{"session_id":%q}`, id), "x-gateway-model-name", "m")
			assert.Equal(t, map[string]float64{"stored_worker": 0, "unknown": 2, "not_candidate": 0}, p.sglangSessionRequests(t))
			p.requireIdle(t)
		})
	}
	t.Run("an open the engine refused", func(t *testing.T) {
		p := newPlane(t, planeOptions{workers: 2, responses: true, filterCfg: func(c *filter.Config) { c.DefaultModel = "m" }})
		_, holder := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10,"session_id":"taken"}`)
		other := p.workers[0]
		if other.Name == holder {
			other = p.workers[1]
		}
		// The other engine holds an id "taken" too (opened past kvroute): it refuses the
		// same id again, and that refusal (400) teaches kvroute nothing.
		direct, err := http.Post("http://"+other.Address+"/open_session", "application/json", strings.NewReader(`{"capacity_of_str_len":10,"session_id":"taken"}`))
		require.NoError(t, err)
		direct.Body.Close()
		require.Equal(t, http.StatusOK, direct.StatusCode)
		release := p.book(t, holder, 0, 8) // by load, the reopen goes to the other worker
		defer release()
		// A GET, whose body kvroute does not read: routed by load.
		req, err := http.NewRequest(http.MethodGet, p.envoy.URL+"/open_session", strings.NewReader(`{"capacity_of_str_len":10,"session_id":"taken"}`))
		require.NoError(t, err)
		resp, err := p.envoy.Client().Do(req)
		require.NoError(t, err)
		_, err = io.ReadAll(resp.Body) // to its end, as openSGLangSession reads
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, other.Name, resp.Header.Get("x-served-by"))
		var out string
		resp, out = p.post(t, "/generate", `{"text":"t","session_params":{"id":"taken"}}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
		assert.Equal(t, holder, resp.Header.Get("x-served-by"), "still the engine whose open succeeded")
		release()
		p.requireIdle(t)
	})
	t.Run("a close naming no session goes by load", func(t *testing.T) {
		p := newPlane(t, planeOptions{workers: 2, responses: true})
		resp, out := p.post(t, "/close_session", `{"rid":"x"}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
		assert.Equal(t, map[string]float64{"stored_worker": 0, "unknown": 0, "not_candidate": 0}, p.sglangSessionRequests(t))
		assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only"}))
	})
}

// TestAnSGLangSessionInUseIsNotForgotten: kvroute forgets a session responses.ttl after
// it last heard of it, and each turn it sends to the session's engine counts: a
// session whose turns come more often than the TTL stays where it is for as long as
// it lasts.
func TestAnSGLangSessionInUseIsNotForgotten(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	ttl := session.DefaultResponsesConfig().TTL
	p := newPlane(t, planeOptions{workers: 3, responses: true, responsesNow: clock.Now})
	id, holder := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10}`)
	release := p.book(t, holder, 0, 8)
	defer release()
	turn := fmt.Sprintf(`{"text":"t","session_params":{"id":%q}}`, id)
	for i := range 4 {
		clock.Advance(ttl * 3 / 4) // 3 TTLs in all since the open
		resp, out := p.post(t, "/generate", turn, "x-gateway-model-name", "m")
		require.Equal(t, http.StatusOK, resp.StatusCode, "turn %d: %s", i, out)
		assert.Equal(t, holder, resp.Header.Get("x-served-by"), "turn %d", i)
	}
	clock.Advance(ttl)
	resp, _ := p.post(t, "/generate", turn, "x-gateway-model-name", "m")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "idle past the TTL: forgotten, routed by load away from its busy engine")
	assert.Equal(t, map[string]float64{"stored_worker": 4, "unknown": 1, "not_candidate": 0}, p.sglangSessionRequests(t))
}

// TestSGLangSessionIDIsTheSessionKey: SGLang's newer session_id on /generate names a
// session without changing the prompt; with session affinity on, it keeps the
// session on its worker as a session header does, and a header, when sent, wins.
func TestSGLangSessionIDIsTheSessionKey(t *testing.T) {
	params := scoring.DynamoParams()
	params.SessionAffinityWeight = 1
	p := newPlane(t, planeOptions{params: params, sessions: true, filterCfg: func(c *filter.Config) { c.DefaultModel = "m" }})
	body := func(text, key string) string {
		return fmt.Sprintf(`{"text":%q,"session_id":%q,"sampling_params":{"max_new_tokens":4}}`, text, key)
	}
	first, _ := p.post(t, "/generate", body("the original, long conversation history of this agent", "agent-7"))
	worker := first.Header.Get("x-served-by")
	release := p.book(t, worker, 0, 3) // a small load gap against the session's worker
	defer release()
	compacted, _ := p.post(t, "/generate", body("a summary of what was said so far", "agent-7"))
	assert.Equal(t, worker, compacted.Header.Get("x-served-by"), "the session stays")
	other, _ := p.post(t, "/generate", body("another agent's own summary of its work", "agent-8"))
	assert.NotEqual(t, worker, other.Header.Get("x-served-by"), "another session follows the load")
	header, _ := p.post(t, "/generate", body("a third summary, its header naming another", "agent-7"), "x-session-id", "agent-9")
	assert.NotEqual(t, worker, header.Header.Get("x-served-by"), "the header wins")
}

// TestSGLangSessionRequestsKeepTheirEngineWhenBodiesAreBusy: a /generate turn or a
// /close_session that does not fit beside the bodies being decoded
// (max_concurrent_body_bytes) is routed by load on its model, but still to the engine
// that holds its session, as a Responses body naming a stored response is: every
// other engine aborts it, or leaves the session open.
func TestSGLangSessionRequestsKeepTheirEngineWhenBodiesAreBusy(t *testing.T) {
	for _, tt := range []struct{ name, path, body string }{
		{"a turn", "/generate", `{"text":%q,"session_params":{"id":%q},"sampling_params":{"max_new_tokens":2}}`},
		{"a close", "/close_session", `{"rid":%q,"session_id":%q}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			enc := newHeldEncoder()
			p := newPlane(t, planeOptions{workers: 3, responses: true, tokenizers: router.OneTokenizer(enc), filterCfg: func(c *filter.Config) {
				c.MaxBodyBytes, c.MaxConcurrentBodyBytes, c.DefaultModel = 4096, 4096, "m"
			}})
			id, holder := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":1000}`)
			release := p.book(t, holder, 0, 8) // by load, it would go to another worker
			defer release()
			held := make(chan int)
			go func() {
				resp, _ := p.post(t, "/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+strings.Repeat("word ", 500)+`"}`)
				held <- resp.StatusCode
			}()
			<-enc.started // 2.5 KB being decoded: 2 KB more do not fit
			unhold := sync.OnceFunc(func() { close(enc.release) })
			defer unhold()

			resp, out := p.post(t, tt.path, fmt.Sprintf(tt.body, strings.Repeat("w", 2000), id))
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			assert.NotContains(t, out, "does not exist")
			assert.Equal(t, holder, resp.Header.Get("x-served-by"))
			assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_requests_total", map[string]string{"outcome": "load_only_busy"}))
			assert.Equal(t, map[string]float64{"stored_worker": 1, "unknown": 0, "not_candidate": 0}, p.sglangSessionRequests(t))
			unhold()
			require.Equal(t, http.StatusOK, <-held)
			release()
			p.waitIdle(t)
		})
	}
}

// TestAReopenOfAnOpenSGLangSessionGoesToItsEngine: an /open_session naming an id
// kvroute knows open goes to that engine, which refuses it. One SGLang refuses a second
// open of an id; a fleet behind kvroute must too, not open a second session of that id
// on another engine (the first one's history then lost to the session's turns, and the
// first left open).
func TestAReopenOfAnOpenSGLangSessionGoesToItsEngine(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 3, responses: true, filterCfg: func(c *filter.Config) { c.DefaultModel = "m" }})
	_, holder := p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10,"session_id":"taken"}`)
	release := p.book(t, holder, 0, 8) // by load, the reopen would go elsewhere
	defer release()
	resp, out := p.post(t, "/open_session", `{"capacity_of_str_len":10,"session_id":"taken"}`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, out)
	assert.Equal(t, holder, resp.Header.Get("x-served-by"))
	for _, w := range p.workers {
		if w.Name != holder {
			assert.Zero(t, w.SGLangSessions(), "%s opened no second session", w.Name)
		}
	}
	// A new id, and one the engine makes, go by load and are not counted.
	p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10,"session_id":"fresh"}`)
	p.openSGLangSession(t, http.MethodPost, `{"capacity_of_str_len":10}`)
	assert.Equal(t, map[string]float64{"stored_worker": 1, "unknown": 0, "not_candidate": 0}, p.sglangSessionRequests(t))
	release()
	p.requireIdle(t)
}
