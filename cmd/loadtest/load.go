package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/onetoken"
	"github.com/kvroute/kvroute/tokenize"
)

// workload shapes the sessions: each starts with a system prompt of prefixTokens and
// grows by userTokens and the answer's outputTokens per turn until its next prompt would
// pass maxPromptTokens; then a new session (a new prefix) starts on the same stream.
type workload struct {
	model string
	// api is the shape the sessions are sent in (-api): a chat completion's, or the
	// Messages or Responses API's, whose bodies vLLM converts to the same chat, or
	// vLLM's token-in generate API's or SGLang's native /generate's, whose sessions are
	// RL episodes of token ids.
	api                      bodyAPI
	prefixTokens, userTokens int
	// sharedPrefix gives every session the same system prompt (drawn once from seed),
	// as a fleet behind one product's prompt: issue 11's shared-prefix scenario, live.
	sharedPrefix    bool
	maxPromptTokens int
	outputTokens    int
	// samples is each generate request's sampling_params.n (-samples): a GRPO group of
	// parallel samples of the episode's prompt, which the engine runs as that many
	// requests. The episode goes on from choice 0's output, as a rollout keeping one
	// trajectory would; the other samples are read and dropped. 1: no n sent.
	samples int
	// samplesMix groups the streams by their requests' samples (-samples-mix), in
	// place of samples: single samples beside GRPO groups. Nil: every stream asks for
	// samples.
	samplesMix                 []sampleClass
	think                      time.Duration
	seed                       uint64
	requestTimeout, errorPause time.Duration
	// tenants group the streams (-tenants): each request names its stream's tenant in
	// fairnessHeader, and a 429 is retried after its retry-after, counted by tenant,
	// rather than failing the run. None: every stream alone, a 429 an error.
	tenants        []tenant
	fairnessHeader string
}

// measured is what is counted after the warm-up: replaced whole when it ends.
type measured struct {
	start                time.Time
	completed            atomic.Int64
	promptTok, cachedTok atomic.Int64
	chunks               atomic.Int64
	resumed, moved       atomic.Int64
	// SGLang sessions (-api sglang-session): opened and closed, and turns the engine
	// aborted for a session it does not hold.
	opened, closed, aborted atomic.Int64
	ttft, latency           hist
	roundTrips              map[string]*hist           // by ext_proc message kind; keys fixed at creation
	tenants                 map[string]*tenantMeasured // by tenant (-tenants); keys fixed at creation
	classes                 map[int]*classMeasured     // by samples a request (-samples-mix); keys fixed at creation
	servedCounts                                       // requests answered, by the worker that answered
}

// servedCounts counts requests by the worker that answered them: the whole load's
// (measured) and a sample class's (classMeasured).
type servedCounts struct {
	mu sync.Mutex
	by map[string]int64
}

// maxServedWorkers bounds servedCounts: the load test runs at most 64 workers, and a
// name past them (none is expected) is counted under "other".
const maxServedWorkers = 64

func (s *servedCounts) served(worker string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]int64{}
	}
	if _, ok := s.by[worker]; !ok && len(s.by) >= maxServedWorkers {
		worker = "other"
	}
	s.by[worker]++
}

// generator drives the streams and counts what happens over the whole run.
type generator struct {
	w     workload
	words []string // of one token each
	// system is every session's system prompt (prefix ids, for generate and sglang) with
	// workload.sharedPrefix; "" otherwise.
	system string
	// urls are the data planes, one per kvroute replica; stream i goes through
	// urls[i % len(urls)], as Envoy spreads ext_proc streams over a cluster.
	urls   []string
	client *http.Client
	cur    atomic.Pointer[measured]
	// tenantOf is each stream's tenant (workload.tenants); nil without tenants.
	tenantOf []string
	// samplesOf is each stream's samples a request (workload.samplesMix); nil without
	// a mix, every stream asking for workload.samples.
	samplesOf []int

	started  atomic.Int64
	finished atomic.Int64 // answered in full, over the whole run
	inFlight atomic.Int64
	errMu    sync.Mutex
	errs     map[string]int64  // by class, over the whole run
	examples map[string]string // one message per class
	// rateLimited counts the 429s retried (with tenants), over the whole run.
	rateLimited atomic.Int64
	// sessionControls counts the /open_session and /close_session requests sent
	// (-api sglang-session), over the whole run: kvroute routes them by load.
	sessionControls atomic.Int64
}

func newGenerator(w workload, streams int) *generator {
	g := &generator{w: w, words: onetoken.Words(), errs: map[string]int64{}, examples: map[string]string{},
		client: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true,
			MaxIdleConns: streams + 16, MaxIdleConnsPerHost: streams + 16}}}
	if w.sharedPrefix {
		// A stream of its own: the streams' draws stay what they are without the flag.
		g.system = g.draw(rand.New(rand.NewPCG(w.seed, math.MaxUint64)), w.prefixTokens)
	}
	g.tenantOf = groupKeys(w.tenants)
	g.samplesOf = groupKeys(w.samplesMix)
	g.reset()
	return g
}

// systemPrompt is a new session's system prompt: the shared one, or a new draw.
func (g *generator) systemPrompt(rng *rand.Rand) string {
	if g.system != "" {
		return g.system
	}
	return g.draw(rng, g.w.prefixTokens)
}

// draw returns n random tokens of the -api's prompts: one-token words, or for the
// token-in APIs (generate, sglang) token ids, comma-separated as in token_ids
// (tokenIDs).
func (g *generator) draw(rng *rand.Rand, n int) string {
	if g.w.api.tokenIn() {
		return tokenIDs(rng, n)
	}
	return words(rng, g.words, n)
}

var messageKinds = []string{"request_headers", "request_body", "response_headers", "response_body"}

// reset starts a new measurement (the end of the warm-up) and returns the old one.
func (g *generator) reset() *measured {
	m := &measured{start: time.Now(), roundTrips: map[string]*hist{}, tenants: map[string]*tenantMeasured{},
		classes: map[int]*classMeasured{}}
	for _, k := range messageKinds {
		m.roundTrips[k] = &hist{}
	}
	for _, t := range g.w.tenants {
		m.tenants[t.key] = newTenantMeasured()
	}
	for _, c := range g.w.samplesMix {
		m.classes[c.key] = &classMeasured{}
	}
	return g.cur.Swap(m)
}

func (g *generator) fail(class string, err error) {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	g.errs[class]++
	if _, ok := g.examples[class]; !ok && err != nil {
		g.examples[class] = err.Error()
	}
}

func (g *generator) errorCount() int64 {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	n := int64(0)
	for _, v := range g.errs {
		n += v
	}
	return n
}

// stream runs sessions back to back until ctx ends; requests already sent finish
// under reqCtx (the drain).
func (g *generator) stream(ctx, reqCtx context.Context, id int) {
	rng := rand.New(rand.NewPCG(g.w.seed, uint64(id)))
	url := g.urls[id%len(g.urls)]
	var t *streamTenant
	if g.tenantOf != nil {
		// Backoff jitter draws from a stream of its own: the sessions' words stay
		// what they are without -tenants.
		t = &streamTenant{name: g.tenantOf[id], rng: rand.New(rand.NewPCG(g.w.seed, uint64(id)|1<<63))}
	}
	samples := g.streamSamples(id)
	for ctx.Err() == nil {
		system := g.systemPrompt(rng)
		session := g.newSession(system, samples)
		if g.w.api == apiSGLangSession {
			if err := g.openSession(reqCtx, url, session); err != nil {
				g.fail("session_open", err)
				sleep(ctx, g.w.errorPause)
				continue
			}
		}
		ended := g.episode(ctx, reqCtx, url, t, samples, rng, session)
		if session.id != "" {
			if err := g.closeSession(reqCtx, url, session); err != nil {
				g.fail("session_close", err)
			}
		}
		if ended {
			return
		}
	}
}

// episode runs one session's turns until it ends (its next prompt would pass
// maxPromptTokens), a turn fails, or ctx ends; it reports true when ctx ended while a
// turn waited to retry (errLoadEnded).
func (g *generator) episode(ctx, reqCtx context.Context, url string, t *streamTenant, samples int, rng *rand.Rand, session *session) bool {
	tokens := g.w.prefixTokens
	last := ""
	for turn := 0; ctx.Err() == nil; turn++ {
		session.add("user", g.draw(rng, g.w.userTokens))
		tokens += g.w.userTokens
		res, err := g.turn(ctx, reqCtx, url, t, samples, session.body())
		if errors.Is(err, errLoadEnded) {
			return true
		}
		if err != nil {
			g.fail(res.class, err)
			if res.class == sessionAborted {
				g.cur.Load().aborted.Add(1)
			}
			if t != nil {
				g.cur.Load().tenants[t.name].fail(res.class)
			}
			sleep(ctx, g.w.errorPause) // a persistent failure must not spin
			return false               // a new session: this history may be half-served
		}
		g.finished.Add(1)
		m := g.cur.Load()
		m.completed.Add(1)
		m.promptTok.Add(res.promptTokens)
		m.cachedTok.Add(res.cachedTokens)
		m.served(res.servedBy)
		if t != nil {
			m.tenants[t.name].completed.Add(1)
		}
		cm := m.classes[samples] // nil without -samples-mix
		if cm != nil {
			cm.completed.Add(1)
			cm.served(res.servedBy)
		}
		if turn > 0 {
			m.resumed.Add(1)
			if cm != nil {
				cm.resumed.Add(1)
			}
			if res.servedBy != last {
				m.moved.Add(1)
				if cm != nil {
					cm.moved.Add(1)
				}
			}
		}
		last = res.servedBy
		session.answered(res)
		tokens += g.w.outputTokens
		if tokens+g.w.userTokens > g.w.maxPromptTokens {
			return false
		}
		sleep(ctx, g.w.think)
	}
	return false
}

// streamSamples is stream id's samples a request: its -samples-mix class's, else
// -samples.
func (g *generator) streamSamples(id int) int {
	if g.samplesOf != nil {
		return g.samplesOf[id]
	}
	return g.w.samples
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// session is one conversation's request body so far, in the -api's shape: its turns
// (JSON each) and, for the Messages and Responses APIs, its system prompt apart. A
// generate or sglang session's turns are runs of token ids (comma-separated), the
// prefix first.
type session struct {
	w      *workload
	system []byte // quoted; nil for chat, generate and sglang, whose system prompt is their first turn
	turns  [][]byte
	// samples is the generate requests' sampling_params.n: the stream's
	// (generator.streamSamples); 1 sends none.
	samples int
	// id is an SGLang session's id (-api sglang-session), as /open_session answered it,
	// and rid the meta_info.id of its last answered turn, which the next continues
	// ("" before the first). turns then hold only what the next turn sends: the
	// engine keeps the rest.
	id, rid string
}

// newSession opens a session whose requests ask for samples parallel samples.
func (g *generator) newSession(system string, samples int) *session {
	s := &session{w: &g.w, samples: samples}
	switch g.w.api {
	case apiChat:
		s.turns = append(s.turns, message("system", system))
	case apiGenerate, apiSGLang, apiSGLangSession:
		s.turns = append(s.turns, []byte(system))
	default:
		s.system, _ = json.Marshal(system)
	}
	return s
}

// add appends a turn: a chat or Messages message {"role","content"} (string content),
// a Responses input item as Codex resends it with store false, a message of one
// input_text (user) or output_text (assistant) part, or a run of generate or sglang
// token ids (new ones drawn, or the output's as read, each after a comma: outputIDs,
// sglangOutput).
func (s *session) add(role, text string) {
	switch s.w.api {
	case apiGenerate, apiSGLang, apiSGLangSession:
		if ids := strings.TrimPrefix(text, ","); ids != "" {
			s.turns = append(s.turns, []byte(ids))
		}
		return
	case apiChat, apiMessages:
		s.turns = append(s.turns, message(role, text))
		return
	}
	part := "input_text"
	if role == "assistant" {
		part = "output_text"
	}
	type content struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	b, _ := json.Marshal(struct {
		Type    string    `json:"type"`
		Role    string    `json:"role"`
		Content []content `json:"content"`
	}{"message", role, []content{{part, text}}})
	s.turns = append(s.turns, b)
}

// answered records a turn's answer: its output is the session's next turn, or, in
// an SGLang session, already in the engine's history, so that only the next
// observation is sent, continuing the answer's request (meta_info.id).
func (s *session) answered(res result) {
	if s.w.api == apiSGLangSession {
		s.turns, s.rid = s.turns[:0], res.rid
		return
	}
	s.add("assistant", res.text)
}

// body is the whole conversation as a streaming request, as each API's clients send
// it: a chat completion with usage (stream_options.include_usage); a Messages body
// with its system prompt top-level; a Responses body with instructions and every turn
// as input, store false (the conversation is resent, not stored on the engine); a
// generate body with usage, max_tokens (and n, with samples) in sampling_params, and
// every turn's ids as one token_ids, as an RL rollout resends its episode; an SGLang /generate body the same
// episode as input_ids, max_new_tokens in sampling_params, and no model (SGLang serves
// one; kvroute routes it for default_model); in an SGLang session (-api
// sglang-session), the same body with only the turn's new ids and session_params.
func (s *session) body() []byte {
	n := 192 + len(s.system)
	for _, m := range s.turns {
		n += len(m) + 1
	}
	b := make([]byte, 0, n)
	if s.w.api == apiSGLang || s.w.api == apiSGLangSession {
		b = append(b, `{"input_ids":[`...)
		b = s.appendTurns(b)
		b = append(b, `],"sampling_params":{"max_new_tokens":`...)
		b = strconv.AppendInt(b, int64(s.w.outputTokens), 10)
		if s.id != "" {
			// The session's turn: only the new ids, continuing its last answered request.
			b = append(b, `},"session_params":{"id":`...)
			b = strconv.AppendQuote(b, s.id)
			if s.rid != "" {
				b = append(b, `,"rid":`...)
				b = strconv.AppendQuote(b, s.rid)
			}
		}
		return append(b, `},"stream":true}`...)
	}
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, s.w.model)
	b = append(b, `,"stream":true,`...)
	switch s.w.api {
	case apiMessages:
		b = append(b, `"max_tokens":`...)
		b = strconv.AppendInt(b, int64(s.w.outputTokens), 10)
		b = append(b, `,"system":`...)
		b = append(b, s.system...)
		b = append(b, `,"messages":[`...)
	case apiResponses:
		b = append(b, `"store":false,"max_output_tokens":`...)
		b = strconv.AppendInt(b, int64(s.w.outputTokens), 10)
		b = append(b, `,"instructions":`...)
		b = append(b, s.system...)
		b = append(b, `,"input":[`...)
	case apiGenerate:
		b = append(b, `"stream_options":{"include_usage":true},"sampling_params":{"max_tokens":`...)
		b = strconv.AppendInt(b, int64(s.w.outputTokens), 10)
		if s.samples > 1 {
			b = append(b, `,"n":`...)
			b = strconv.AppendInt(b, int64(s.samples), 10)
		}
		b = append(b, `},"token_ids":[`...)
	default:
		b = append(b, `"stream_options":{"include_usage":true},"max_tokens":`...)
		b = strconv.AppendInt(b, int64(s.w.outputTokens), 10)
		b = append(b, `,"messages":[`...)
	}
	b = s.appendTurns(b)
	return append(b, "]}"...)
}

// appendTurns appends the turns, comma-separated.
func (s *session) appendTurns(b []byte) []byte {
	for i, m := range s.turns {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m...)
	}
	return b
}

// message is one chat message's JSON.
func message(role, content string) []byte {
	b, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{role, content})
	return b
}

// generateVocabulary bounds the generate and sglang sessions' drawn ids: ordinary tokens of both
// tokenizers the workers may run (the approximate one's ids are below it, and the
// embedded Qwen3's special tokens above it). The workers refuse only ids past 2^32.
const generateVocabulary = tokenize.ApproxVocabSize

// tokenIDs returns n random token ids below generateVocabulary, comma-separated.
func tokenIDs(rng *rand.Rand, n int) string {
	b := make([]byte, 0, 7*n)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, rng.Uint64N(generateVocabulary), 10)
	}
	return string(b)
}

// words returns n random words of one token each (package onetoken: in kvroute's
// embedded default tokenizer and in the approximate one), with a line break instead of a
// space every 16 words (chat text has them, and JSON escapes them; the break is a token
// of its own).
func words(rng *rand.Rand, vocabulary []string, n int) string {
	b := make([]byte, 0, 4*n)
	for i := range n {
		sep := byte(' ')
		if i%16 == 15 {
			sep = '\n'
		}
		b = append(b, sep)
		b = append(b, vocabulary[rng.IntN(len(vocabulary))]...)
	}
	return string(b)
}

// streamTenant is a stream's tenant and the randomness of its backoffs.
type streamTenant struct {
	name string
	rng  *rand.Rand
}

// turn sends one turn's request, which asks for samples parallel samples; with a
// tenant, it retries the request after each 429 (retryDelay), counting the 429s, and
// times the turn from its first attempt. It returns errLoadEnded when ctx ended while
// it waited to retry.
func (g *generator) turn(ctx, reqCtx context.Context, url string, t *streamTenant, samples int, body []byte) (result, error) {
	if t == nil {
		return g.request(reqCtx, url, "", samples, body, time.Time{})
	}
	first := time.Now()
	for retry := 0; ; retry++ {
		res, err := g.request(reqCtx, url, t.name, samples, body, first)
		if err == nil || res.status != rateLimitStatus {
			return res, err
		}
		g.rateLimited.Add(1)
		tm := g.cur.Load().tenants[t.name]
		tm.rateLimited.Add(1)
		if retry == sdkMaxRetries {
			tm.sdkGaveUp.Add(1)
		}
		sleep(ctx, retryDelay(res, retry, t.rng))
		if ctx.Err() != nil {
			return res, errLoadEnded
		}
	}
}

// retryDelay is how long a 429 is waited out before retry number retry (0 first):
// the delay it asks for, else backoff.
func retryDelay(res result, retry int, rng *rand.Rand) time.Duration {
	if res.retryAfterOK {
		return res.retryAfter
	}
	return backoff(retry, rng)
}

// result is one answered request.
type result struct {
	class                      string // the error class when failing
	status                     int    // the HTTP status, when one came
	retryAfter                 time.Duration
	retryAfterOK               bool // a 429's retry-after named retryAfter
	servedBy, text             string
	promptTokens, cachedTokens int64
	rid                        string // an SGLang answer's meta_info.id
}

var (
	dataPrefix  = []byte("data: ")
	done        = []byte("[DONE]")
	usageKey    = []byte(`"usage":{`)
	contentKey  = []byte(`"content":"`)
	eventPrefix = []byte("event: ")
	textKey     = []byte(`"text":"`)  // a Messages content_block_delta's
	deltaKey    = []byte(`"delta":"`) // a Responses output_text.delta's
	tokenIDsKey = []byte(`"token_ids":[`)
)

// request sends one streaming request in the -api's shape and reads it to the end;
// its body asks for samples parallel samples (generate), whose chunks it reads by
// choice index when more than one. With a tenant it names it in the fairness header
// and records the request in the tenant's figures too, timed from first (the turn's
// first attempt); with -samples-mix, in its sample class's too.
func (g *generator) request(ctx context.Context, url, tenant string, samples int, body []byte, first time.Time) (result, error) {
	g.started.Add(1)
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, g.w.requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+g.w.api.path(), bytes.NewReader(body))
	if err != nil {
		return result{class: "request"}, err
	}
	req.Header.Set("content-type", "application/json")
	if tenant != "" {
		req.Header.Set(g.w.fairnessHeader, tenant)
	}
	begin := time.Now()
	if !first.IsZero() {
		begin = first
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return result{class: "transport"}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res := result{class: "status " + strconv.Itoa(resp.StatusCode), status: resp.StatusCode}
		if resp.StatusCode == http.StatusBadRequest && g.w.api == apiSGLangSession && unknownSession(msg) {
			res.class = sessionAborted
		}
		if resp.StatusCode == rateLimitStatus {
			res.retryAfter, res.retryAfterOK = retryAfter(resp.Header, time.Now())
		}
		return res, fmt.Errorf("%s: %s", resp.Status, msg)
	}
	res := result{status: resp.StatusCode, servedBy: resp.Header.Get("x-served-by")}
	var text, event []byte
	outputCame := false // an output came, whichever sample's
	var sg sglangStream
	m := g.cur.Load()
	var tm *tenantMeasured
	if tenant != "" {
		tm = m.tenants[tenant]
	}
	cm := m.classes[samples] // nil without -samples-mix
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if name, ok := bytes.CutPrefix(line, eventPrefix); ok {
			event = append(event[:0], name...) // the Messages and Responses APIs' named events
			continue
		}
		payload, ok := bytes.CutPrefix(line, dataPrefix)
		if !ok {
			continue
		}
		var step streamStep
		var err error
		switch g.w.api {
		case apiMessages:
			step, err = messagesEvent(string(event), payload, &res)
		case apiResponses:
			step, err = responsesEvent(string(event), payload, &res)
		case apiGenerate:
			step, err = chunkEvent(payload, &res, outputIDs)
			if err == nil && step.delta && samples > 1 {
				// A sample's chunk: its output counts for the TTFT and the chunks; the
				// episode goes on from choice 0's.
				if i, err := choiceIndex(payload); err != nil {
					return result{class: "bad chunk"}, err
				} else if i != 0 {
					step.other, step.text = len(step.text) > 0, nil
				}
			}
		case apiSGLang, apiSGLangSession:
			step, err = sg.event(payload, &res)
		default:
			step, err = chunkEvent(payload, &res, content)
		}
		if err != nil {
			return result{class: step.class}, err
		}
		if step.done {
			took := time.Since(begin)
			m.latency.observe(took)
			if tm != nil {
				tm.latency.observe(took)
			}
			if cm != nil {
				cm.latency.observe(took)
			}
			res.text = string(text)
			return res, nil
		}
		if step.text != nil || step.delta {
			if !outputCame && (len(step.text) > 0 || step.other) {
				outputCame = true
				took := time.Since(begin)
				m.ttft.observe(took)
				if tm != nil {
					tm.ttft.observe(took)
				}
				if cm != nil {
					cm.ttft.observe(took)
				}
			}
			text = append(text, step.text...)
			m.chunks.Add(1)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return result{class: "timeout"}, err
		}
		return result{class: "read"}, err
	}
	return result{class: "truncated"}, fmt.Errorf("the stream ended before its end (%s)", g.w.api.end())
}

// streamStep is what one SSE event of a response tells: its end, or generated text (a
// delta event, whose text may be empty), or an error's class.
type streamStep struct {
	done  bool
	delta bool
	text  []byte
	// other: output of a parallel sample other than choice 0 (text nil): the
	// response's, not the episode's.
	other bool
	class string
}

// chunkEvent reads a chat completion's or a generate stream's chunk: data: [DONE] ends
// the stream, the usage chunk gives prompt_tokens and prompt_tokens_details.cached_tokens,
// and any other chunk its output, read by delta (content, outputIDs).
func chunkEvent(payload []byte, res *result, delta func([]byte) ([]byte, error)) (streamStep, error) {
	switch {
	case bytes.Equal(payload, done):
		return streamStep{done: true}, nil
	case bytes.Contains(payload, usageKey):
		var u struct {
			Usage struct {
				PromptTokens        int64 `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(payload, &u); err != nil {
			return streamStep{class: "bad usage"}, err
		}
		res.promptTokens, res.cachedTokens = u.Usage.PromptTokens, u.Usage.PromptTokensDetails.CachedTokens
		return streamStep{}, nil
	}
	c, err := delta(payload)
	if err != nil {
		return streamStep{class: "bad chunk"}, err
	}
	return streamStep{delta: true, text: c}, nil
}

// messagesEvent reads an Anthropic Messages stream's event: content_block_delta
// carries text, message_delta the usage (input_tokens leave out the cache reads and
// writes, counted apart), message_stop ends it, and error is a failure.
func messagesEvent(event string, payload []byte, res *result) (streamStep, error) {
	switch event {
	case "content_block_delta":
		c, err := deltaText(payload, textKey, func(b []byte) (string, error) {
			var e struct {
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}
			err := json.Unmarshal(b, &e)
			return e.Delta.Text, err
		})
		if err != nil {
			return streamStep{class: "bad chunk"}, err
		}
		return streamStep{delta: true, text: c}, nil
	case "message_delta":
		var e struct {
			Usage *struct {
				InputTokens              int64 `json:"input_tokens"`
				CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
				CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(payload, &e); err != nil {
			return streamStep{class: "bad usage"}, err
		}
		if u := e.Usage; u != nil {
			res.promptTokens = u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
			res.cachedTokens = u.CacheReadInputTokens
		}
	case "message_stop":
		return streamStep{done: true}, nil
	case "error":
		return streamStep{class: "stream error"}, fmt.Errorf("error event: %.300s", payload)
	}
	return streamStep{}, nil
}

// responsesEvent reads a Responses stream's event: response.output_text.delta carries
// text, response.completed the usage (input_tokens, with
// input_tokens_details.cached_tokens) and ends it (vLLM sends no [DONE]), and
// response.failed, response.incomplete and error are failures.
func responsesEvent(event string, payload []byte, res *result) (streamStep, error) {
	switch event {
	case "response.output_text.delta":
		c, err := deltaText(payload, deltaKey, func(b []byte) (string, error) {
			var e struct {
				Delta string `json:"delta"`
			}
			err := json.Unmarshal(b, &e)
			return e.Delta, err
		})
		if err != nil {
			return streamStep{class: "bad chunk"}, err
		}
		return streamStep{delta: true, text: c}, nil
	case "response.completed":
		var e struct {
			Response struct {
				Usage *struct {
					InputTokens        int64 `json:"input_tokens"`
					InputTokensDetails struct {
						CachedTokens int64 `json:"cached_tokens"`
					} `json:"input_tokens_details"`
				} `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal(payload, &e); err != nil {
			return streamStep{class: "bad usage"}, err
		}
		if u := e.Response.Usage; u != nil {
			res.promptTokens, res.cachedTokens = u.InputTokens, u.InputTokensDetails.CachedTokens
		}
		return streamStep{done: true}, nil
	case "response.failed", "response.incomplete", "error":
		return streamStep{class: "stream error"}, fmt.Errorf("%s event: %.300s", event, payload)
	}
	return streamStep{}, nil
}

// deltaText returns an event's text, the string after key, read directly unless it
// holds an escape (then decode reads the event).
func deltaText(payload, key []byte, decode func([]byte) (string, error)) ([]byte, error) {
	_, rest, ok := bytes.Cut(payload, key)
	if !ok {
		return nil, fmt.Errorf("no text in %.300q", payload)
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil, fmt.Errorf("unterminated text in %.300q", payload)
	}
	if bytes.IndexByte(rest[:end], '\\') < 0 {
		return rest[:end], nil
	}
	s, err := decode(payload)
	return []byte(s), err
}

// content returns a chunk's delta content. The workers write plain words, so the
// string is read directly unless it holds an escape.
func content(payload []byte) ([]byte, error) {
	_, rest, ok := bytes.Cut(payload, contentKey)
	if !ok {
		return nil, nil // a role-only or finish chunk
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil, fmt.Errorf("unterminated content in %q", payload)
	}
	if bytes.IndexByte(rest[:end], '\\') < 0 {
		return rest[:end], nil
	}
	var s string
	dec := json.NewDecoder(bytes.NewReader(payload))
	var chunk struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := dec.Decode(&chunk); err != nil {
		return nil, err
	}
	for _, c := range chunk.Choices {
		s += c.Delta.Content
	}
	return []byte(s), nil
}

// outputIDs returns a generate chunk's new token ids (choices[0].token_ids), each after
// a comma, so that a response's chunks append to one run (session.add drops the first
// comma). The engine writes them plainly, so the array is read directly unless it holds
// anything but digits and commas.
func outputIDs(payload []byte) ([]byte, error) {
	_, rest, ok := bytes.Cut(payload, tokenIDsKey)
	if !ok {
		return nil, fmt.Errorf("no token_ids in %.300q", payload)
	}
	end := bytes.IndexByte(rest, ']')
	if end < 0 {
		return nil, fmt.Errorf("unterminated token_ids in %.300q", payload)
	}
	if plain := rest[:end]; len(bytes.Trim(plain, "0123456789,")) == 0 {
		if len(plain) == 0 {
			return nil, nil
		}
		return append([]byte{','}, plain...), nil
	}
	var chunk struct {
		Choices []struct {
			TokenIDs []uint32 `json:"token_ids"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(payload, &chunk); err != nil {
		return nil, err
	}
	if len(chunk.Choices) == 0 {
		return nil, nil
	}
	return appendIDs(nil, chunk.Choices[0].TokenIDs), nil
}

// appendIDs appends ids to b, each after a comma: a run of output ids as outputIDs and
// sglangStream.event return them.
func appendIDs(b []byte, ids []uint32) []byte {
	for _, id := range ids {
		b = strconv.AppendUint(append(b, ','), uint64(id), 10)
	}
	return b
}

// choicesIndex precedes the index of a generate chunk's choice, as vLLM dumps it
// (GenerateResponseStreamChoice's first field).
var choicesIndex = []byte(`"choices":[{"index":`)

// choiceIndex returns the index of a generate chunk's (one) choice: which parallel
// sample its token ids are of.
func choiceIndex(payload []byte) (int, error) {
	_, rest, ok := bytes.Cut(payload, choicesIndex)
	if ok {
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if i, err := strconv.Atoi(string(rest[:end])); err == nil {
			return i, nil
		}
	}
	var chunk struct {
		Choices []struct {
			Index *int `json:"index"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(payload, &chunk); err != nil {
		return 0, err
	}
	if len(chunk.Choices) != 1 || chunk.Choices[0].Index == nil {
		return 0, fmt.Errorf("want one choice with an index in %.300q", payload)
	}
	return *chunk.Choices[0].Index, nil
}

// sglangStream is what an SGLang /generate stream has told so far. SGLang (without
// --incremental-streaming-output) sends in each chunk the text and output_ids so far
// and a meta_info, whose finish_reason is null until the last chunk: a chunk's new
// output is its output_ids past those of the chunk before.
type sglangStream struct {
	seen     int  // output ids read so far
	finished bool // a chunk's meta_info had a finish_reason
}

// sglangChunk is what sglangStream reads of a chunk: not its text (the ids are the output).
type sglangChunk struct {
	OutputIDs *[]uint32 `json:"output_ids"`
	MetaInfo  *struct {
		ID           string          `json:"id"`
		PromptTokens int64           `json:"prompt_tokens"`
		CachedTokens int64           `json:"cached_tokens"`
		FinishReason json.RawMessage `json:"finish_reason"`
	} `json:"meta_info"`
	Error json.RawMessage `json:"error"`
}

// event reads an SGLang stream's event: data: [DONE] ends it (after a finished chunk),
// a chunk with "error" is a failure (SGLang's ValueErrors, streamed after the 200), and
// any other chunk gives the output ids new since the one before (each after a comma, as
// outputIDs' are) and, as its meta_info, prompt_tokens and cached_tokens: the last
// chunk's are the request's.
func (s *sglangStream) event(payload []byte, res *result) (streamStep, error) {
	if bytes.Equal(payload, done) {
		if !s.finished {
			return streamStep{class: "truncated"}, errors.New("data: [DONE] before a chunk with a finish_reason")
		}
		return streamStep{done: true}, nil
	}
	var c sglangChunk
	if err := json.Unmarshal(payload, &c); err != nil {
		return streamStep{class: "bad chunk"}, err
	}
	if c.MetaInfo != nil {
		// SGLang's abort (a session the engine does not hold, among others): one chunk,
		// finished, then [DONE], after a 200.
		if msg, aborted := sglangAbort(c.MetaInfo.FinishReason); aborted {
			class := "aborted"
			if unknownSession([]byte(msg)) {
				class = sessionAborted
			}
			return streamStep{class: class}, fmt.Errorf("aborted: %.300s", payload)
		}
	}
	switch {
	case !isJSONNull(c.Error):
		return streamStep{class: "stream error"}, fmt.Errorf("error chunk: %.300s", payload)
	case c.OutputIDs == nil || c.MetaInfo == nil:
		return streamStep{class: "bad chunk"}, fmt.Errorf("no output_ids or meta_info in %.300q", payload)
	case len(*c.OutputIDs) < s.seen:
		return streamStep{class: "bad chunk"}, fmt.Errorf("a chunk's %d output_ids after %d: SGLang's chunks hold every id so far", len(*c.OutputIDs), s.seen)
	}
	res.promptTokens, res.cachedTokens, res.rid = c.MetaInfo.PromptTokens, c.MetaInfo.CachedTokens, c.MetaInfo.ID
	s.finished = !isJSONNull(c.MetaInfo.FinishReason)
	b := appendIDs(nil, (*c.OutputIDs)[s.seen:])
	s.seen = len(*c.OutputIDs)
	return streamStep{delta: true, text: b}, nil
}

func isJSONNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// sessionAborted is the error class of a turn the engine aborted for a session it
// does not hold (unknownSession): the turn went to another engine than the one that
// opened its session.
const sessionAborted = "session_aborted"

// sglangAbort reads a finish_reason: whether it is SGLang's abort ({"type": "abort",
// "message": …}), and its message.
func sglangAbort(raw json.RawMessage) (string, bool) {
	if isJSONNull(raw) {
		return "", false
	}
	var f struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &f) != nil || f.Type != "abort" {
		return "", false
	}
	return f.Message, true
}

// unknownSession reports SGLang's refusal of a turn naming a session the engine does
// not hold, in a 400's body or an abort's message: "Invalid request: session id …
// does not exist".
func unknownSession(msg []byte) bool {
	_, rest, ok := bytes.Cut(msg, []byte("session id "))
	return ok && bytes.Contains(rest, []byte("does not exist"))
}

// bodyAPI is the API the sessions are sent in (-api).
type bodyAPI string

const (
	apiChat      bodyAPI = "chat"      // POST /v1/chat/completions
	apiMessages  bodyAPI = "messages"  // POST /v1/messages: Anthropic's, vLLM converts it to a chat
	apiResponses bodyAPI = "responses" // POST /v1/responses, store false: OpenAI's, converted too
	apiGenerate  bodyAPI = "generate"  // POST /inference/v1/generate: vLLM's token-in/token-out API
	apiSGLang    bodyAPI = "sglang"    // POST /generate: SGLang's native API, input_ids, no model
	// apiSGLangSession: the same episodes as SGLang sessions, each opened (POST
	// /open_session), its turns /generate bodies of the new ids alone naming it in
	// session_params, and closed (POST /close_session).
	apiSGLangSession bodyAPI = "sglang-session"
)

var bodyAPIs = []bodyAPI{apiChat, apiMessages, apiResponses, apiGenerate, apiSGLang, apiSGLangSession}

// bodyAPINames lists the -api values (bodyAPIs) for errors: "chat, messages, …, or
// sglang".
func bodyAPINames() string {
	names := make([]string, len(bodyAPIs))
	for i, a := range bodyAPIs {
		names[i] = string(a)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// tokenIn reports an API whose sessions are episodes of token ids.
func (a bodyAPI) tokenIn() bool { return a == apiGenerate || a == apiSGLang || a == apiSGLangSession }

// defaultModel is the default_model kvroute needs for the API's bodies, which name no
// model (SGLang's): the workers' model; "" for the others.
func (a bodyAPI) defaultModel(model string) string {
	if a == apiSGLang || a == apiSGLangSession {
		return model
	}
	return ""
}

// parseBodyAPI reads -api.
func parseBodyAPI(s string) (bodyAPI, error) {
	for _, a := range bodyAPIs {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("-api: unknown API %q (want %s)", s, bodyAPINames())
}

// path is where the API's requests go.
func (a bodyAPI) path() string {
	switch a {
	case apiMessages:
		return "/v1/messages"
	case apiResponses:
		return "/v1/responses"
	case apiGenerate:
		return "/inference/v1/generate"
	case apiSGLang, apiSGLangSession:
		return "/generate"
	}
	return "/v1/chat/completions"
}

// end is the event that ends the API's stream.
func (a bodyAPI) end() string {
	switch a {
	case apiMessages:
		return "event: message_stop"
	case apiResponses:
		return "event: response.completed"
	}
	return "data: [DONE]"
}
