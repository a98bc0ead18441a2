package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/tokenize"
)

// The render endpoints, under the configured base URL. Newer vLLM serves the
// Messages and Responses ones too (vllm-project/vllm#45803 and #50195, read from its
// source; both answer one GenerateRequest, as the chat one does); an older server
// answers 404, an OutcomeStatus.
const (
	ChatPath        = "/v1/chat/completions/render"
	CompletionsPath = "/v1/completions/render"
	ResponsesPath   = "/v1/responses/render"
	MessagesPath    = "/v1/messages/render"
)

// replyBytesPerToken bounds a reply's size per token id: an id of up to ten digits and
// its comma, with room for the rest of the GenerateRequest (sampling_params, features).
const (
	replyBytesPerToken = 12
	replyOverheadBytes = 1 << 20
)

// Outcomes of a render, the outcome label of kvroute_engine_renders_total.
const (
	OutcomeOK          = "ok"
	OutcomeBusy        = "busy"         // every slot taken: not sent
	OutcomeTimeout     = "timeout"      // no reply within the timeout
	OutcomeUnreachable = "unreachable"  // the connection failed
	OutcomeStatus      = "error_status" // a non-200 answer (vLLM's ErrorResponse)
	OutcomeBadReply    = "bad_reply"    // a 200 whose body is not a usable reply
	OutcomeCanceled    = "canceled"     // the request's own context ended first
)

// OutcomeUnauthorized is a render answered 401 or 403: the server wants an API key
// (api_key_file, api_key_env) or another one.
const OutcomeUnauthorized = "unauthorized"

// Client asks one model's render endpoint for prompt token ids. Build it with [New].
type Client struct {
	model     string
	base      string
	timeout   time.Duration
	maxTokens int
	slots     chan struct{}
	http      *http.Client
	metrics   *Metrics
	// auth is the Authorization header value ("Bearer KEY"), nil without a key; a
	// reload swaps it.
	auth atomic.Pointer[string]
}

var _ tokenize.PromptEncoder = (*Client)(nil)

// New returns a client of cfg's render endpoint for model (the metrics' model label).
// maxTokens bounds the ids a reply may carry (the filter's max_prompt_tokens). A nil
// httpClient gets one of its own that reads no proxy settings from the environment
// (render servers sit beside kvroute) and keeps MaxConcurrency connections alive.
func New(cfg Config, model string, maxTokens int, httpClient *http.Client, metrics *Metrics) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if maxTokens <= 0 {
		return nil, fmt.Errorf("engine: maxTokens must be > 0, got %d", maxTokens)
	}
	key, err := cfg.ReadAPIKey()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if httpClient == nil {
		httpClient = &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        cfg.MaxConcurrency,
			MaxIdleConnsPerHost: cfg.MaxConcurrency,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   false,
		}}
	}
	c := &Client{model: model, base: strings.TrimSuffix(cfg.URL, "/"), timeout: cfg.Timeout, maxTokens: maxTokens,
		slots: make(chan struct{}, cfg.MaxConcurrency), http: httpClient, metrics: metrics}
	c.SetAPIKey(key)
	return c, nil
}

// SetAPIKey makes key the API key of the next renders ("": none), as a reload does
// with what [Config.ReadAPIKey] read.
func (c *Client) SetAPIKey(key string) {
	if key == "" {
		c.auth.Store(nil)
		return
	}
	auth := "Bearer " + key
	c.auth.Store(&auth)
}

// EncodePrompt implements [tokenize.PromptEncoder]: it posts the request body to the
// render endpoint of its API (p.BodyAPI: chat completions, completions, Responses or
// Messages; by default chat when p.Chat is set, else completions), and returns the ids
// of the reply with an empty text (the endpoints return no prompt text). The Chat a
// Responses or Messages body comes with is not used: the engine converts the body
// itself. Every error wraps [tokenize.ErrEngine]; a reply of more than maxTokens ids
// is one (the engine did the work already, and the reply's size is bounded by
// maxTokens). A prompt without a body wraps [tokenize.ErrUnsupported].
func (c *Client) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	if p.Body == nil {
		// A prompt read from no body the engine renders (a Responses body naming a
		// stored response is never sent: vLLM's render refuses it).
		return tokenize.Encoding{}, fmt.Errorf("%w: %s: no request body to render", tokenize.ErrUnsupported, c.model)
	}
	var path string
	var parse func([]byte, int) ([]uint32, error)
	switch api := p.BodyAPI.Of(p); api {
	case tokenize.APIChat:
		path, parse = ChatPath, ParseChatRender
	case tokenize.APICompletions:
		path, parse = CompletionsPath, ParseCompletionsRender
	case tokenize.APIResponses:
		path, parse = ResponsesPath, ParseResponsesRender
	case tokenize.APIMessages:
		path, parse = MessagesPath, ParseMessagesRender
	default:
		return tokenize.Encoding{}, fmt.Errorf("%w: %s: no render endpoint for a body of API %s", tokenize.ErrUnsupported, c.model, api)
	}
	start := time.Now()
	ids, outcome, err := c.render(ctx, path, p.Body, parse)
	c.metrics.observe(c.model, outcome, time.Since(start))
	if err != nil {
		return tokenize.Encoding{}, fmt.Errorf("%w: %s %s: %v", tokenize.ErrEngine, c.model, outcome, err)
	}
	return tokenize.Encoding{IDs: ids}, nil
}

func (c *Client) render(ctx context.Context, path string, body []byte, parse func([]byte, int) ([]uint32, error)) ([]uint32, string, error) {
	if body == nil {
		return nil, OutcomeBadReply, errors.New("no request body to send")
	}
	select {
	case c.slots <- struct{}{}:
		defer func() { <-c.slots }()
	default:
		return nil, OutcomeBusy, fmt.Errorf("%d renders already in flight", cap(c.slots))
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, OutcomeUnreachable, err
	}
	req.Header.Set("content-type", "application/json")
	if auth := c.auth.Load(); auth != nil {
		req.Header.Set("authorization", *auth)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, failure(ctx, err), err
	}
	defer resp.Body.Close()
	limit := int64(c.maxTokens)*replyBytesPerToken + replyOverheadBytes
	if resp.StatusCode != http.StatusOK {
		// The body (vLLM's ErrorResponse) may quote the prompt: keep it out of errors.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return nil, OutcomeUnauthorized, fmt.Errorf("status %d: the render server wants an API key (api_key_file, api_key_env) or another one", resp.StatusCode)
		}
		return nil, OutcomeStatus, fmt.Errorf("status %d", resp.StatusCode)
	}
	reply, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, failure(ctx, err), err
	}
	if int64(len(reply)) > limit {
		return nil, OutcomeBadReply, fmt.Errorf("reply larger than %d bytes", limit)
	}
	ids, err := parse(reply, c.maxTokens)
	if err != nil {
		return nil, OutcomeBadReply, err
	}
	return ids, OutcomeOK, nil
}

// failure classifies a transport error: the timeout, the caller's cancellation, or a
// connection failure.
func failure(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return OutcomeTimeout
	case ctx.Err() != nil:
		return OutcomeCanceled
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return OutcomeTimeout
	}
	return OutcomeUnreachable
}
