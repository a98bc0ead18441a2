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
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/onetoken"
)

// workload shapes the sessions: each starts with a system prompt of prefixTokens and
// grows by userTokens and the answer's outputTokens per turn until its next prompt would
// pass maxPromptTokens; then a new session (a new prefix) starts on the same stream.
type workload struct {
	model                    string
	prefixTokens, userTokens int
	// sharedPrefix gives every session the same system prompt (drawn once from seed),
	// as a fleet behind one product's prompt: issue 11's shared-prefix scenario, live.
	sharedPrefix               bool
	maxPromptTokens            int
	outputTokens               int
	think                      time.Duration
	seed                       uint64
	requestTimeout, errorPause time.Duration
}

// measured is what is counted after the warm-up: replaced whole when it ends.
type measured struct {
	start                time.Time
	completed            atomic.Int64
	promptTok, cachedTok atomic.Int64
	chunks               atomic.Int64
	resumed, moved       atomic.Int64
	ttft, latency        hist
	roundTrips           map[string]*hist // by ext_proc message kind; keys fixed at creation

	servedMu sync.Mutex
	servedBy map[string]int64 // requests answered, by the worker that answered
}

// maxServedWorkers bounds servedBy: the load test runs at most 64 workers, and a name
// past them (none is expected) is counted under "other".
const maxServedWorkers = 64

func (m *measured) served(worker string) {
	m.servedMu.Lock()
	defer m.servedMu.Unlock()
	if _, ok := m.servedBy[worker]; !ok && len(m.servedBy) >= maxServedWorkers {
		worker = "other"
	}
	m.servedBy[worker]++
}

// generator drives the streams and counts what happens over the whole run.
type generator struct {
	w     workload
	words []string // of one token each
	// system is every session's system prompt with workload.sharedPrefix; "" otherwise.
	system string
	// urls are the data planes, one per kvroute replica; stream i goes through
	// urls[i % len(urls)], as Envoy spreads ext_proc streams over a cluster.
	urls   []string
	client *http.Client
	cur    atomic.Pointer[measured]

	started  atomic.Int64
	finished atomic.Int64 // answered in full, over the whole run
	inFlight atomic.Int64
	errMu    sync.Mutex
	errs     map[string]int64  // by class, over the whole run
	examples map[string]string // one message per class
}

func newGenerator(w workload, streams int) *generator {
	g := &generator{w: w, words: onetoken.Words(), errs: map[string]int64{}, examples: map[string]string{},
		client: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true,
			MaxIdleConns: streams + 16, MaxIdleConnsPerHost: streams + 16}}}
	if w.sharedPrefix {
		// A stream of its own: the streams' draws stay what they are without the flag.
		g.system = words(rand.New(rand.NewPCG(w.seed, math.MaxUint64)), g.words, w.prefixTokens)
	}
	g.reset()
	return g
}

// systemPrompt is a new session's system prompt: the shared one, or a new draw.
func (g *generator) systemPrompt(rng *rand.Rand) string {
	if g.system != "" {
		return g.system
	}
	return words(rng, g.words, g.w.prefixTokens)
}

var messageKinds = []string{"request_headers", "request_body", "response_headers", "response_body"}

// reset starts a new measurement (the end of the warm-up) and returns the old one.
func (g *generator) reset() *measured {
	m := &measured{start: time.Now(), roundTrips: map[string]*hist{}, servedBy: map[string]int64{}}
	for _, k := range messageKinds {
		m.roundTrips[k] = &hist{}
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
	for ctx.Err() == nil {
		msgs := [][]byte{message("system", g.systemPrompt(rng))}
		tokens := g.w.prefixTokens
		last := ""
		for turn := 0; ctx.Err() == nil; turn++ {
			msgs = append(msgs, message("user", words(rng, g.words, g.w.userTokens)))
			tokens += g.w.userTokens
			res, err := g.request(reqCtx, url, g.body(msgs))
			if err != nil {
				g.fail(res.class, err)
				sleep(ctx, g.w.errorPause) // a persistent failure must not spin
				break                      // a new session: this history may be half-served
			}
			g.finished.Add(1)
			m := g.cur.Load()
			m.completed.Add(1)
			m.promptTok.Add(res.promptTokens)
			m.cachedTok.Add(res.cachedTokens)
			m.served(res.servedBy)
			if turn > 0 {
				m.resumed.Add(1)
				if res.servedBy != last {
					m.moved.Add(1)
				}
			}
			last = res.servedBy
			msgs = append(msgs, message("assistant", res.text))
			tokens += g.w.outputTokens
			if tokens+g.w.userTokens > g.w.maxPromptTokens {
				break
			}
			sleep(ctx, g.w.think)
		}
	}
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

// body is a streaming chat request with usage, as OpenAI clients send it.
func (g *generator) body(msgs [][]byte) []byte {
	n := 128
	for _, m := range msgs {
		n += len(m) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, g.w.model)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":`...)
	b = strconv.AppendInt(b, int64(g.w.outputTokens), 10)
	b = append(b, `,"messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m...)
	}
	return append(b, "]}"...)
}

// message is one chat message's JSON.
func message(role, content string) []byte {
	b, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{role, content})
	return b
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

// result is one answered request.
type result struct {
	class                      string // the error class when failing
	servedBy, text             string
	promptTokens, cachedTokens int64
}

var (
	dataPrefix = []byte("data: ")
	done       = []byte("[DONE]")
	usageKey   = []byte(`"usage":{`)
	contentKey = []byte(`"content":"`)
)

// request sends one streaming chat and reads it to the end.
func (g *generator) request(ctx context.Context, url string, body []byte) (result, error) {
	g.started.Add(1)
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	ctx, cancel := context.WithTimeout(ctx, g.w.requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return result{class: "request"}, err
	}
	req.Header.Set("content-type", "application/json")
	begin := time.Now()
	resp, err := g.client.Do(req)
	if err != nil {
		return result{class: "transport"}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return result{class: "status " + strconv.Itoa(resp.StatusCode)}, fmt.Errorf("%s: %s", resp.Status, msg)
	}
	res := result{servedBy: resp.Header.Get("x-served-by")}
	var text []byte
	m := g.cur.Load()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		payload, ok := bytes.CutPrefix(sc.Bytes(), dataPrefix)
		if !ok {
			continue
		}
		switch {
		case bytes.Equal(payload, done):
			m.latency.observe(time.Since(begin))
			res.text = string(text)
			return res, nil
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
				return result{class: "bad usage"}, err
			}
			res.promptTokens, res.cachedTokens = u.Usage.PromptTokens, u.Usage.PromptTokensDetails.CachedTokens
		default:
			c, err := content(payload)
			if err != nil {
				return result{class: "bad chunk"}, err
			}
			if len(text) == 0 && len(c) > 0 {
				m.ttft.observe(time.Since(begin))
			}
			text = append(text, c...)
			m.chunks.Add(1)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return result{class: "timeout"}, err
		}
		return result{class: "read"}, err
	}
	return result{class: "truncated"}, errors.New("the stream ended without data: [DONE]")
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
