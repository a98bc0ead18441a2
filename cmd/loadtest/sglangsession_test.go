package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
)

// TestSGLangAbortsAreReadInBothForms: SGLang refuses a turn naming a session it does not
// hold with a 400 (not streamed) or a 200 whose one event is finished with an abort
// (streamed); both are the class session_aborted, another abort is "aborted", and a
// finished chunk that is no abort is an answer.
func TestSGLangAbortsAreReadInBothForms(t *testing.T) {
	const unknown = `Invalid request: session id 0123abcd does not exist`
	abort := func(msg string) []byte {
		b, _ := json.Marshal(map[string]any{"text": "", "output_ids": []int{}, "meta_info": map[string]any{"id": "r1", "prompt_tokens": 9,
			"cached_tokens": 0, "finish_reason": map[string]any{"type": "abort", "message": msg, "status_code": 400, "err_type": "BadRequestError"}}})
		return b
	}
	for _, tt := range []struct {
		name    string
		payload []byte
		class   string // "" when read as an answer
	}{
		{"unknown session", abort(unknown), sessionAborted},
		{"another abort", abort("Streaming session already has an active request."), "aborted"},
		{"an abort without output_ids", []byte(`{"meta_info":{"id":"r","finish_reason":{"type":"abort","message":"` + unknown + `"}}}`), sessionAborted},
		{"finished", []byte(`{"text":"x","output_ids":[7],"meta_info":{"id":"r2","finish_reason":{"type":"length","length":1},"prompt_tokens":9,"cached_tokens":0}}`), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s sglangStream
			var res result
			step, err := s.event(tt.payload, &res)
			if tt.class == "" {
				require.NoError(t, err)
				assert.Equal(t, "r2", res.rid, "meta_info.id is the request the next turn continues")
				return
			}
			require.Error(t, err)
			assert.Equal(t, tt.class, step.class)
		})
	}
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{`{"error":{"message":"` + unknown + `"}}`, true},
		{`{"error":{"message":"Invalid request session id"}}`, false}, // an unknown rid
		{`{"error":{"message":"The input (9 tokens) is longer than the model's context length (8 tokens)."}}`, false},
	} {
		assert.Equal(t, tt.want, unknownSession([]byte(tt.msg)), tt.msg)
	}

	// Against the mockworker: a turn naming a session it does not hold, streamed and not.
	worker, err := mockworker.New(mockworker.Config{Name: "w0", Speed: 1000, Seed: 1,
		Engine: sim.Config{BlockSize: 16, MaxNumSeqs: 2, NumGPUBlocks: 1024, MaxBatchedTokens: 8192}})
	require.NoError(t, err)
	defer worker.Close()
	srv := httptest.NewServer(worker.Handler())
	defer srv.Close()
	w := defaultOptions().load
	w.api = apiSGLangSession
	g := newGenerator(w, 1)
	for _, stream := range []bool{true, false} {
		body := `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":4},"session_params":{"id":"0123abcd"},"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		res, err := g.request(context.Background(), srv.URL, "", 1, []byte(body), time.Time{})
		require.Error(t, err, "stream %t", stream)
		assert.Equal(t, sessionAborted, res.class, "stream %t: %v", stream, err)
	}
}

// TestSGLangSessionStreams runs one sglang-session stream against mockworkers directly.
// On one worker, each session is opened, its first turn sends the prefix and the
// user's ids naming the session, each later turn only the new ids continuing the last
// answer (session_params.rid, its meta_info.id), the worker finds the history cached,
// and the session is closed. With the opens served by one worker and the turns by
// another, every turn is aborted, counted as session_aborted, and the sessions are
// still closed.
func TestSGLangSessionStreams(t *testing.T) {
	newWorker := func(name string) http.Handler {
		w, err := mockworker.New(mockworker.Config{Name: name, Speed: 1000, DefaultMaxTokens: 16, Seed: 1,
			Engine: sim.Config{BlockSize: 16, MaxNumSeqs: 2, NumGPUBlocks: 4096, MaxBatchedTokens: 8192}})
		require.NoError(t, err)
		t.Cleanup(w.Close)
		return w.Handler()
	}
	w := defaultOptions().load
	w.api = apiSGLangSession
	// Two turns a session: 64 + 8, then + 4 + 8, then past 90.
	w.prefixTokens, w.userTokens, w.maxPromptTokens, w.outputTokens = 64, 8, 90, 4
	w.errorPause = time.Millisecond

	type exchange struct {
		path           string
		body, response []byte
	}
	run := func(opens, turns http.Handler, wantExchanges int) (*generator, []exchange) {
		var mu sync.Mutex
		var got []exchange
		enough := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			tee := &teeWriter{ResponseWriter: rw}
			h := turns
			if r.URL.Path == "/open_session" {
				h = opens
			}
			h.ServeHTTP(tee, r)
			mu.Lock()
			defer mu.Unlock()
			if got = append(got, exchange{r.URL.Path, body, tee.buf.Bytes()}); len(got) == wantExchanges {
				close(enough)
			}
		}))
		defer srv.Close()
		g := newGenerator(w, 1)
		g.urls = []string{srv.URL}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.stream(ctx, context.Background(), 0) }()
		select {
		case <-enough:
		case <-time.After(30 * time.Second):
			t.Fatal("too few requests")
		}
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return g, append([]exchange(nil), got...)
	}

	t.Run("one worker", func(t *testing.T) {
		one := newWorker("w0")
		g, got := run(one, one, 8) // two sessions: open, two turns, close
		assert.Zero(t, g.errorCount(), "errors: %v", g.errs)
		require.GreaterOrEqual(t, len(got), 8)
		var paths []string
		for _, e := range got[:8] {
			paths = append(paths, e.path)
		}
		assert.Equal(t, strings.Fields("/open_session /generate /generate /close_session /open_session /generate /generate /close_session"), paths)
		var id string
		require.NoError(t, json.Unmarshal(got[0].response, &id))
		type turnBody struct {
			InputIDs      []int64 `json:"input_ids"`
			SessionParams struct {
				ID  string  `json:"id"`
				RID *string `json:"rid"`
			} `json:"session_params"`
		}
		var first, second turnBody
		require.NoError(t, json.Unmarshal(got[1].body, &first))
		require.NoError(t, json.Unmarshal(got[2].body, &second))
		assert.Equal(t, id, first.SessionParams.ID)
		assert.Nil(t, first.SessionParams.RID, "the first turn continues nothing")
		assert.Len(t, first.InputIDs, w.prefixTokens+w.userTokens)
		assert.Equal(t, id, second.SessionParams.ID)
		require.NotNil(t, second.SessionParams.RID)
		assert.Equal(t, lastMetaID(t, got[1].response), *second.SessionParams.RID, "the second turn continues the first's answer")
		assert.Len(t, second.InputIDs, w.userTokens, "only the new observation")
		assert.JSONEq(t, `{"session_id":"`+id+`"}`, string(got[3].body))
		m := g.cur.Load()
		assert.GreaterOrEqual(t, m.opened.Load(), int64(2))
		assert.GreaterOrEqual(t, m.closed.Load(), int64(2))
		assert.Zero(t, m.aborted.Load())
		assert.Positive(t, m.cachedTok.Load(), "the second turn finds the session's history cached")
		assert.GreaterOrEqual(t, m.promptTok.Load(), int64(2*(64+8)+4+8), "the engine's prompt is the whole history")
	})

	t.Run("opened elsewhere", func(t *testing.T) {
		g, _ := run(newWorker("w0"), newWorker("w1"), 6) // two sessions: open, an aborted turn, close
		m := g.cur.Load()
		assert.GreaterOrEqual(t, m.aborted.Load(), int64(2))
		assert.Zero(t, m.completed.Load())
		assert.GreaterOrEqual(t, m.closed.Load(), int64(2))
		g.errMu.Lock()
		defer g.errMu.Unlock()
		assert.Equal(t, []string{sessionAborted}, sortedKeys(g.errs))
		assert.Equal(t, m.aborted.Load(), g.errs[sessionAborted], "no warm-up: every abort measured")
		assert.Contains(t, g.examples[sessionAborted], "does not exist")
	})
}

// lastMetaID is an SGLang stream's last chunk's meta_info.id.
func lastMetaID(t *testing.T, sse []byte) string {
	t.Helper()
	id := ""
	for line := range strings.Lines(string(sse)) {
		payload, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var c struct {
			MetaInfo struct {
				ID string `json:"id"`
			} `json:"meta_info"`
		}
		require.NoError(t, json.Unmarshal([]byte(payload), &c))
		id = c.MetaInfo.ID
	}
	require.NotEmpty(t, id)
	return id
}

// TestReportCountsSGLangSessions: the report prints the sessions' figures, and lets
// kvroute's load_only outcomes stand for the opens and closes sent, not more.
func TestReportCountsSGLangSessions(t *testing.T) {
	o := defaultOptions()
	o.load.api = apiSGLangSession
	r := &report{opts: o, Requests: 30, SGLangSessions: &sglangSessionsReport{Opened: 5, Closed: 4, Aborted: 10}, sessionControls: 9,
		KvrouteOutcomes: map[string]float64{"routed": 40, "load_only": 9}}
	var out strings.Builder
	r.print(&out)
	assert.Contains(t, out.String(), "SGLang sessions: 5 opened, 4 closed; 10 turns aborted for a session their engine does not hold (of 40 answered or aborted)")
	assert.Empty(t, r.notRouted())
	r.KvrouteOutcomes["load_only"] = 10
	assert.Len(t, r.notRouted(), 1, "a load_only past the opens and closes")
}
