// Package fakeworker is an OpenAI-compatible test upstream that records what it served.
// It answers instantly with canned text; it is for protocol tests, not for measuring
// routing (the simulated engine of cmd/mockworker is).
//
// Prompts steer it: one containing FAIL_UPSTREAM gets a 503, one containing
// HANG_BEFORE_FIRST_TOKEN sends nothing (not even headers) until the client goes, and a
// streamed one containing HANG_AFTER_FIRST_TOKEN sends one chunk and then waits for the
// client to go. One containing ECHO_MODEL generates text naming its model as JSON
// would (`{"model":"<model>"}`), and a non-streamed one containing GZIP_RESPONSE is
// answered gzip-compressed (content-encoding: gzip). Kill ends the process as a crash would, Restart brings it back on the
// same address.
// GET /health answers 200, or 503 after SetHealthy(false); GET /metrics reports vLLM's
// waiting-requests and KV-usage gauges as SetLoad set them, and its running-requests
// gauge as SetRunning set it (0: it answers instantly). Neither is recorded as
// served.
//
// It serves OpenAI's Responses API as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1,
// whose store is a map in the engine's process (responses.go). POST /v1/responses
// answers with the ids resp_<Name>_<n> (n counting from 1 per worker, never reused, also
// across restarts) and stores the response unless "store" is false; a
// previous_response_id this worker does not hold gets vLLM's 404
// {"error":{"message":"Response with id '<id>' not found.","type":"invalid_request_error","param":"response_id","code":404}}.
// "stream":true answers with vLLM's named events (event: response.created first,
// carrying the id; response.completed last; no [DONE]). "background":true answers at
// once with the queued response, generated already unless the prompt holds a HANG_
// word: then it stays queued until cancelled. GET /v1/responses/{id} returns a stored
// response, POST /v1/responses/{id}/cancel cancels a queued one (400 for a finished
// one, as in vLLM), and both answer the 404 above for an id the store lacks.
// StoredResponses lists the store; Kill and Restart empty it, as a restarted engine's is
// empty. The prompt conventions hold for responses too: FAIL_UPSTREAM,
// HANG_BEFORE_FIRST_TOKEN, HANG_AFTER_HEADERS, HANG_AFTER_FIRST_TOKEN (after the first
// output_text.delta), ECHO_MODEL and GZIP_RESPONSE (non-streamed), and SplitResponses;
// SetUsage does not apply (responses report 10 input tokens, 4 cached, 3 output). The
// fake does not check the model, and streams no background response on GET.
//
// It serves SGLang's sessions (sglangsessions.go): /open_session (any method) answers the id
// of the session it opens as a JSON string (the body's session_id, else
// <Name>-session-<n>; 400 when that one is open already), /close_session closes one
// (200, empty), and a /generate body whose session_params.id names a session the
// worker does not hold is refused as SGLang's scheduler refuses it. SGLangSessions
// counts the open ones; Kill and Restart close them all.
//
// It serves Anthropic's Messages API as vLLM does (messages.go): POST /v1/messages
// answers with a message msg_<Name>_<n>, or with "stream":true its named events
// (message_start to message_stop); a body without model or messages gets a 400 in
// Anthropic's error shape, and so does any other path under /v1/messages a 404.
// FAIL_UPSTREAM and HANG_BEFORE_FIRST_TOKEN hold there too; the other prompt
// conventions, SplitResponses and SetUsage do not.
package fakeworker

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
)

// Worker is a running fake upstream.
type Worker struct {
	Name string
	// Address is the literal ip:port it listens on.
	Address string

	srvMu     sync.Mutex // guards srv, replaced by Restart
	srv       *httptest.Server
	mu        sync.Mutex
	served    []Served
	unhealthy atomic.Bool
	waiting   atomic.Int64
	running   atomic.Int64
	kvUsage   atomic.Uint64 // math.Float64bits
	usage     atomic.Pointer[string]
	split     atomic.Pointer[split]

	// The Responses API store (responses.go), guarded by mu: what an engine keeps in
	// its process, so Kill and Restart empty it.
	stored   map[string]*response
	lastResp int    // the n of the last resp_<name>_<n> handed out; never reset
	epoch    uint64 // counts Kills and Restarts: a request begun before one stores nothing
	messages int    // Messages API replies so far, which number their ids
	// SGLang's sessions (sglangsessions.go), guarded by mu: in the engine's memory, so
	// Kill and Restart empty them. sessionsOpened numbers the ids it hands out.
	sglangSessions map[string]bool
	sessionsOpened int
}

type split struct {
	cut  func(body []byte) int
	wait func(n int)
}

// SplitResponses makes the worker write each response body (the whole JSON, or the whole
// event stream) in two pieces, cut at the offset cut returns for it (not cut when that
// is ≤ 0 or ≥ the body's length): it flushes the first, then calls wait with its length
// before it writes the rest. A test's wait holds the rest until the data plane has
// passed the first piece on, so that the two reach the processor as separate messages.
// A nil cut restores whole writes, event by event.
func (w *Worker) SplitResponses(cut func(body []byte) int, wait func(n int)) {
	if cut == nil {
		w.split.Store(nil)
		return
	}
	w.split.Store(&split{cut: cut, wait: wait})
}

// SetUsage replaces the usage object the worker reports (JSON, e.g. a hostile
// `{"prompt_tokens":-1}`); "" restores the default.
func (w *Worker) SetUsage(usageJSON string) {
	if usageJSON == "" {
		w.usage.Store(nil)
		return
	}
	w.usage.Store(&usageJSON)
}

func (w *Worker) usageJSON() string {
	if u := w.usage.Load(); u != nil {
		return *u
	}
	return usage
}

// SetLoad sets what GET /metrics reports: requests waiting and KV cache usage in [0,1].
func (w *Worker) SetLoad(waiting int, kvUsage float64) {
	w.waiting.Store(int64(waiting))
	w.kvUsage.Store(math.Float64bits(kvUsage))
}

// SetRunning sets the running requests GET /metrics reports: requests the engine runs
// that did not come through the router under test.
func (w *Worker) SetRunning(running int) { w.running.Store(int64(running)) }

// SetHealthy makes GET /health answer 200 (true) or 503 (false).
func (w *Worker) SetHealthy(healthy bool) { w.unhealthy.Store(!healthy) }

// Served is one request the worker answered.
type Served struct {
	Path   string
	Header http.Header
	Body   []byte
}

// New starts a worker on loopback. Close it when done.
func New(name string) *Worker {
	w := &Worker{Name: name}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	w.Address = strings.TrimPrefix(w.srv.URL, "http://")
	return w
}

// Close stops the worker.
func (w *Worker) Close() {
	w.srvMu.Lock()
	defer w.srvMu.Unlock()
	w.srv.Close()
}

// Kill stops the worker as a crash does: connections in use are cut mid-response and
// new ones are refused. Restart brings it back.
func (w *Worker) Kill() {
	w.srvMu.Lock()
	defer w.srvMu.Unlock()
	w.srv.CloseClientConnections()
	w.srv.Close()
	w.forgetEngineState()
}

// Restart serves again on the same address after Kill or Close (a restarted engine).
func (w *Worker) Restart() error {
	w.srvMu.Lock()
	defer w.srvMu.Unlock()
	ln, err := net.Listen("tcp", w.Address)
	if err != nil {
		return fmt.Errorf("fakeworker: restart on %s: %w", w.Address, err)
	}
	w.forgetEngineState()
	w.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(w.serve)}}
	w.srv.Start()
	return nil
}

// Served returns the requests answered so far.
func (w *Worker) Served() []Served {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Served(nil), w.served...)
}

func (w *Worker) serve(rw http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/health" {
		if w.unhealthy.Load() {
			rw.WriteHeader(http.StatusServiceUnavailable)
		}
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/metrics" {
		rw.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(rw, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"qwen\"} %d\n", w.running.Load())
		fmt.Fprintf(rw, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"qwen\"} %d\n", w.waiting.Load())
		fmt.Fprintf(rw, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"qwen\"} %g\n", math.Float64frombits(w.kvUsage.Load()))
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.mu.Lock()
	w.served = append(w.served, Served{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	w.mu.Unlock()
	rw.Header().Set("x-served-by", w.Name)
	if r.URL.Path == responsesPath || strings.HasPrefix(r.URL.Path, responsesPath+"/") {
		w.serveResponses(rw, r, body)
		return
	}
	if r.URL.Path == messagesPath || strings.HasPrefix(r.URL.Path, messagesPath+"/") {
		w.serveMessages(rw, r, body)
		return
	}
	if w.serveSGLangSessions(rw, r, body) {
		return
	}

	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	switch {
	case strings.Contains(string(body), "HANG_BEFORE_FIRST_TOKEN"):
		<-r.Context().Done()
	case strings.Contains(string(body), "HANG_AFTER_HEADERS"):
		// A non-streamed response: its headers, then the body once generation ends.
		rw.Header().Set("content-type", "application/json")
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
	case strings.Contains(string(body), "FAIL_UPSTREAM"):
		rw.Header().Set("content-type", "application/json")
		rw.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(rw, `{"error":{"message":"engine overloaded","type":"server_error","param":null,"code":null}}`)
	case w.split.Load() != nil && req.Stream:
		rw.Header().Set("content-type", "text/event-stream")
		var b strings.Builder
		for i := range 3 {
			fmt.Fprintf(&b, "data: %s\n\n", chunk(chat, req.Model, text(body, req.Model, fmt.Sprintf("t%d ", i))))
		}
		fmt.Fprintf(&b, "data: %s\n\ndata: [DONE]\n\n", usageChunk(chat, req.Model, w.usageJSON()))
		w.writeSplit(rw, []byte(b.String()))
	case req.Stream:
		rw.Header().Set("content-type", "text/event-stream")
		hang := strings.Contains(string(body), "HANG_AFTER_FIRST_TOKEN")
		for i := range 3 {
			fmt.Fprintf(rw, "data: %s\n\n", chunk(chat, req.Model, text(body, req.Model, fmt.Sprintf("t%d ", i))))
			rw.(http.Flusher).Flush()
			if hang {
				<-r.Context().Done()
				return
			}
		}
		fmt.Fprintf(rw, "data: %s\n\ndata: [DONE]\n\n", usageChunk(chat, req.Model, w.usageJSON()))
	default:
		rw.Header().Set("content-type", "application/json")
		out := []byte(whole(chat, req.Model, text(body, req.Model, "hello from "+w.Name), w.usageJSON()))
		w.writeSplit(rw, maybeGzip(rw, body, out))
	}
}

// maybeGzip is out, gzip-compressed (with its content-encoding header set) when the
// request body asks for it with GZIP_RESPONSE.
func maybeGzip(rw http.ResponseWriter, body, out []byte) []byte {
	if !bytes.Contains(body, []byte("GZIP_RESPONSE")) {
		return out
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(out)
	_ = zw.Close()
	rw.Header().Set("content-encoding", "gzip")
	return z.Bytes()
}

// text is the text the worker generates: text itself, or with ECHO_MODEL in the
// request, its model named as JSON would.
func text(body []byte, model, text string) string {
	if bytes.Contains(body, []byte("ECHO_MODEL")) {
		return fmt.Sprintf(`{"model":%q} `, model)
	}
	return text
}

// writeSplit writes a response body, in two pieces if SplitResponses says so.
func (w *Worker) writeSplit(rw http.ResponseWriter, body []byte) {
	sp := w.split.Load()
	n := 0
	if sp != nil {
		n = sp.cut(body)
	}
	if n <= 0 || n >= len(body) {
		_, _ = rw.Write(body)
		return
	}
	_, _ = rw.Write(body[:n])
	rw.(http.Flusher).Flush()
	sp.wait(n)
	_, _ = rw.Write(body[n:])
}

const usage = `{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}`

func chunk(chat bool, model, text string) string {
	if chat {
		return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"role":"assistant","content":%q},"finish_reason":null}]}`, model, text)
	}
	return fmt.Sprintf(`{"id":"c1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":%q,"finish_reason":null}]}`, model, text)
}

func usageChunk(chat bool, model, usage string) string {
	if chat {
		return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[],"usage":%s}`, model, usage)
	}
	return fmt.Sprintf(`{"id":"c1","object":"text_completion","created":1,"model":%q,"choices":[],"usage":%s}`, model, usage)
}

func whole(chat bool, model, text, usage string) string {
	if chat {
		return fmt.Sprintf(`{"id":"c1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`, model, text, usage)
	}
	return fmt.Sprintf(`{"id":"c1","object":"text_completion","created":1,"model":%q,"choices":[{"index":0,"text":%q,"finish_reason":"stop"}],"usage":%s}`, model, text, usage)
}
