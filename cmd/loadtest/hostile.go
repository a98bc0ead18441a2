package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A hostileKind is one shape of request built to cost a router what a legitimate one
// does not (README "Failure modes"): a completions prompt that is slow to tokenize, or a
// chat body of so many tiny JSON values that materialising it would take many times
// the body.
type hostileKind string

const (
	hostileDigits   hostileKind = "digits"    // a completions prompt of digits alone
	hostileSpaces   hostileKind = "spaces"    // a completions prompt of one run of spaces
	hostileLetter   hostileKind = "letter"    // a completions prompt of one run of "a"
	hostileTinyJSON hostileKind = "tiny-json" // a chat whose message holds an extra key of [0,0,…]
)

var hostileKinds = []hostileKind{hostileDigits, hostileSpaces, hostileLetter, hostileTinyJSON}

// minHostileBytes leaves room for the JSON around a hostile prompt and for its
// variants (hostileVariants).
const minHostileBytes = 4 << 10

// hostileHeader marks a hostile request (its value is the kind): the load test's
// workers refuse such a request with a 400 once they have read its body, as an engine
// refuses a prompt past its context, so the load test spends no CPU on it past the
// transport and what is measured is kvroute's cost. kvroute forwards it unread.
const hostileHeader = "x-loadtest-hostile"

// hostileRefusedHeader is on a worker's refusal: a hostile request that kvroute routed.
const hostileRefusedHeader = "x-loadtest-refused-by"

// parseHostileKinds reads -hostile-kind: a comma-separated list of distinct kinds.
func parseHostileKinds(s string) ([]hostileKind, error) {
	if s == "" {
		return nil, nil
	}
	var out []hostileKind
	for _, name := range strings.Split(s, ",") {
		k := hostileKind(strings.TrimSpace(name))
		switch {
		case !slices.Contains(hostileKinds, k):
			return nil, fmt.Errorf("-hostile-kind: unknown kind %q (want one or more of %s, comma-separated)", name, kindList())
		case slices.Contains(out, k):
			return nil, fmt.Errorf("-hostile-kind: %q given twice", name)
		}
		out = append(out, k)
	}
	return out, nil
}

func kindList() string {
	names := make([]string, len(hostileKinds))
	for i, k := range hostileKinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// path is the endpoint a kind is sent to.
func (k hostileKind) path() string {
	if k == hostileTinyJSON {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// hostileVariants is how many different bodies a kind of prompt text takes: each
// request's differs from the last, as an attacker's would, so that no cache (the
// tokenizer's segment memo kept a whole 4 MiB prompt's ids) answers it.
const hostileVariants = 1024

// hostileBody is one kind's bodies, all of one size: base is variant 0; variant v > 0
// of a prompt text drops v bytes of the prompt and puts v spaces after its closing
// quote.
type hostileBody struct {
	base   []byte
	prompt bool   // a completions prompt text (the variants differ)
	closer []byte // `"` and hostileVariants-1 spaces
}

// body returns the kind's bodies of exactly size bytes (at least minHostileBytes),
// for model.
func (k hostileKind) body(model string, size int) *hostileBody {
	head := `{"model":` + strconv.Quote(model) + `,"max_tokens":1,`
	b := make([]byte, 0, size)
	switch k {
	case hostileTinyJSON:
		head += `"messages":[{"role":"user","content":"hi","x":[0`
		const tail = `]}]}`
		b = append(b, head...)
		// ",0" pairs fill the rest; an odd byte left over is a space after the "[".
		n := size - len(head) - len(tail)
		if n%2 == 1 {
			b = slices.Insert(b, len(b)-1, ' ')
			n--
		}
		for range n / 2 {
			b = append(b, ",0"...)
		}
		return &hostileBody{base: append(b, tail...)}
	default:
		head += `"prompt":"`
		const tail = `"}`
		b = append(b, head...)
		fill := map[hostileKind]string{hostileDigits: "0123456789", hostileSpaces: " ", hostileLetter: "a"}[k]
		for i := range size - len(head) - len(tail) {
			b = append(b, fill[i%len(fill)])
		}
		closer := append([]byte{'"'}, bytes.Repeat([]byte{' '}, hostileVariants-1)...)
		return &hostileBody{base: append(b, tail...), prompt: true, closer: closer}
	}
}

// reader returns variant v's body (v modulo hostileVariants), without copying it.
func (h *hostileBody) reader(v int) io.Reader {
	v %= hostileVariants
	if !h.prompt || v == 0 {
		return bytes.NewReader(h.base)
	}
	cut := len(h.base) - len(`"}`) - v
	return io.MultiReader(bytes.NewReader(h.base[:cut]), bytes.NewReader(h.closer[:1+v]), strings.NewReader("}"))
}

// hostileClient sends the hostile requests on connections of its own and counts their
// outcomes apart from the legitimate traffic's.
type hostileClient struct {
	urls    []string
	client  *http.Client
	timeout time.Duration
	bodies  map[hostileKind]*hostileBody // built once, read-only
	sent    atomic.Int64                 // picks each request's variant

	mu    sync.Mutex
	kinds map[hostileKind]*hostileCounts
}

// hostileCounts are one kind's outcomes: by outcome ("routed", "status 504",
// "transport", …), with one message per outcome, and the time to the whole answer.
type hostileCounts struct {
	outcomes map[string]int64
	examples map[string]string
	latency  hist
}

func newHostileClient(kinds []hostileKind, model string, size, streams int, timeout time.Duration) *hostileClient {
	c := &hostileClient{timeout: timeout, bodies: map[hostileKind]*hostileBody{}, kinds: map[hostileKind]*hostileCounts{},
		client: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true,
			MaxIdleConns: streams * len(kinds), MaxIdleConnsPerHost: streams * len(kinds)}}}
	for _, k := range kinds {
		c.bodies[k] = k.body(model, size)
		c.kinds[k] = &hostileCounts{outcomes: map[string]int64{}, examples: map[string]string{}}
	}
	return c
}

// stream sends requests of kind k until ctx ends, each as soon as the last is answered
// and at least every apart after the last began; the one in flight then finishes under
// reqCtx.
func (c *hostileClient) stream(ctx, reqCtx context.Context, k hostileKind, id int, every time.Duration) {
	url := c.urls[id%len(c.urls)] + k.path()
	for ctx.Err() == nil {
		begin := time.Now()
		outcome, msg := c.send(reqCtx, url, k)
		took := time.Since(begin)
		c.count(k, outcome, msg, took)
		wait := every - took
		if outcome == "transport" {
			wait = max(wait, 100*time.Millisecond) // a persistent failure must not spin
		}
		sleep(ctx, wait)
	}
}

// send sends one hostile request and reads the answer to its end.
func (c *hostileClient) send(ctx context.Context, url string, k hostileKind) (outcome, msg string) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	body := c.bodies[k]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body.reader(int(c.sent.Add(1))))
	if err != nil {
		return "request", err.Error()
	}
	req.ContentLength = int64(len(body.base))
	req.Header.Set("content-type", "application/json")
	req.Header.Set(hostileHeader, string(k))
	resp, err := c.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "timeout", err.Error()
		}
		return "transport", err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "read", err.Error()
	}
	if resp.Header.Get(hostileRefusedHeader) != "" {
		return "routed", resp.Header.Get(hostileRefusedHeader)
	}
	return "status " + strconv.Itoa(resp.StatusCode), string(bytes.TrimSpace(b[:min(len(b), 240)]))
}

func (c *hostileClient) count(k hostileKind, outcome, msg string, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.kinds[k]
	h.outcomes[outcome]++
	if _, ok := h.examples[outcome]; !ok {
		h.examples[outcome] = msg
	}
	h.latency.observe(took)
}

// hostileKindReport is one kind's outcomes over the run.
type hostileKindReport struct {
	Streams  int               `json:"streams"`
	Bytes    int               `json:"body_bytes"`
	Sent     int64             `json:"answered"`
	PerSec   float64           `json:"answered_per_second"`
	Outcomes map[string]int64  `json:"outcomes"`
	Examples map[string]string `json:"examples"`
	Latency  latency           `json:"latency"`
}

// report summarises each kind; secs is how long the hostile streams ran.
func (c *hostileClient) report(streams int, secs float64) map[string]hostileKindReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]hostileKindReport{}
	for k, h := range c.kinds {
		r := hostileKindReport{Streams: streams, Bytes: len(c.bodies[k].base), Outcomes: map[string]int64{}, Examples: map[string]string{},
			Latency: summarize(&h.latency)}
		for o, n := range h.outcomes {
			r.Outcomes[o], r.Examples[o] = n, h.examples[o]
			r.Sent += n
		}
		if secs > 0 {
			r.PerSec = float64(r.Sent) / secs
		}
		out[string(k)] = r
	}
	return out
}

// refuseHostile wraps a worker: a hostile request is read to its end and refused with
// the 400 an engine gives a prompt past its context, naming the worker; every other
// request is served.
func refuseHostile(name string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(hostileHeader) == "" {
			next.ServeHTTP(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(hostileRefusedHeader, name)
		writeRefusal(w)
	})
}

func writeRefusal(w http.ResponseWriter) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = io.WriteString(w, `{"error":{"message":"the load test's workers refuse hostile requests (as past the model's context)","type":"BadRequestError","param":null,"code":400}}`)
}
