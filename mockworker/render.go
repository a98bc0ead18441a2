package mockworker

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// generateRequest is vLLM's GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py,
// later scale_out/token_in_token_out/protocol.py),
// what its render endpoints answer: the prompt's token ids and the request's sampling
// parameters, ready for the engine. The worker fills the fields kvroute and clients read;
// sampling_params holds only max_tokens.
type generateRequest struct {
	RequestID        string         `json:"request_id"`
	TokenIDs         []uint32       `json:"token_ids"`
	Features         any            `json:"features"`
	SamplingParams   map[string]any `json:"sampling_params"`
	Model            string         `json:"model"`
	Stream           bool           `json:"stream"`
	StreamOptions    any            `json:"stream_options"`
	CacheSalt        *string        `json:"cache_salt"`
	Priority         int            `json:"priority"`
	KVTransferParams any            `json:"kv_transfer_params"`
}

// serveRender answers vLLM's render endpoints as vLLM does, with the prompt's ids as
// the worker itself computes them: POST /v1/chat/completions/render, and
// /v1/messages/render and /v1/responses/render (one GenerateRequest object each), and
// /v1/completions/render (a list of them, one per prompt; a batch is rendered by its
// first prompt only, which is what kvroute reads). A Messages or Responses body is
// rendered as vLLM converts it, through kvroute's own conversion (openai.MessagesChat,
// openai.ResponsesChat) and the chat render; a Responses body naming a stored response
// gets the 400 of vLLM's stateless render. A request the worker cannot render gets
// vLLM's 400. Config.RenderDelay makes it a slow render server; Config.RenderAPIKey
// makes it want an API key.
func (s *Server) serveRender(w http.ResponseWriter, r *http.Request, api tokenize.API) {
	if !s.authorized(r) {
		// vLLM's AuthenticationMiddleware answers before reading the body.
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
		return
	}
	// The body is read first: only then does the server notice a client that hangs up
	// (and cancel r's context), which a delayed answer waits on.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "cannot read the body")
		return
	}
	if s.cfg.RenderDelay > 0 {
		select {
		case <-time.After(s.cfg.RenderDelay):
		case <-r.Context().Done():
			return
		}
	}
	p, err := s.renderPrompt(r.Context(), body, api)
	if err != nil || len(p.ids) == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprint("cannot render the prompt: ", err))
		return
	}
	maxTokens := s.cfg.DefaultMaxTokens
	var extra struct {
		MaxTokens           *int `json:"max_tokens"`
		MaxCompletionTokens *int `json:"max_completion_tokens"`
		MaxOutputTokens     *int `json:"max_output_tokens"`
	}
	if json.Unmarshal(body, &extra) == nil {
		for _, v := range []*int{extra.MaxTokens, extra.MaxCompletionTokens, extra.MaxOutputTokens} {
			if v != nil && *v > 0 {
				maxTokens = *v
			}
		}
	}
	s.mu.Lock()
	id := s.nextID
	s.nextID++
	s.mu.Unlock()
	g := generateRequest{TokenIDs: p.ids, SamplingParams: map[string]any{"max_tokens": maxTokens}, Model: p.model, Stream: p.stream}
	if p.cacheSalt != "" {
		g.CacheSalt = &p.cacheSalt
	}
	var reply any
	switch api {
	case tokenize.APICompletions:
		g.RequestID = fmt.Sprintf("cmpl-%s-render-%d", s.cfg.Name, id)
		reply = []generateRequest{g}
	case tokenize.APIResponses:
		g.RequestID = fmt.Sprintf("resp_%s-render-%d", s.cfg.Name, id)
		reply = g
	default:
		g.RequestID = fmt.Sprintf("chatcmpl-%s-render-%d", s.cfg.Name, id)
		reply = g
	}
	b, err := json.Marshal(reply)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(b)
}

// renderedPrompt is what a render reply tells of its request.
type renderedPrompt struct {
	model, cacheSalt string
	stream           bool
	ids              []uint32
}

// renderPrompt computes the ids of a render request's prompt: a chat or completions
// body's as the worker serves it, a Messages or Responses body's as vLLM converts it
// (kvroute's conversion) and renders the converted chat.
func (s *Server) renderPrompt(ctx context.Context, body []byte, api tokenize.API) (renderedPrompt, error) {
	lim := openai.DefaultLimits()
	switch api {
	case tokenize.APIMessages:
		parsed, err := openai.ParseMessages(body, lim)
		if err != nil {
			return renderedPrompt{}, err
		}
		chat, err := openai.MessagesChat(body, lim)
		if err != nil {
			return renderedPrompt{}, err
		}
		// Encoded as the chat completion vLLM converts the body to.
		enc, err := s.encoderOf(parsed.Model).EncodePrompt(ctx, tokenize.Prompt{Chat: chat})
		return renderedPrompt{model: parsed.Model, cacheSalt: parsed.CacheSalt, stream: parsed.Stream, ids: enc.IDs}, err
	case tokenize.APIResponses:
		parsed, err := openai.ParseResponses(body, lim)
		if err != nil {
			return renderedPrompt{}, err
		}
		if parsed.PreviousResponseID != "" {
			return renderedPrompt{}, errors.New("previous_response_id is not supported by the stateless render endpoint")
		}
		chat, err := openai.ResponsesChat(body, lim)
		if err != nil {
			return renderedPrompt{}, err
		}
		// vLLM encodes a Responses request's rendered chat with add_special_tokens true.
		addSpecialTokens := true
		enc, err := s.encoderOf(parsed.Model).EncodePrompt(ctx, tokenize.Prompt{Chat: chat, AddSpecialTokens: &addSpecialTokens})
		return renderedPrompt{model: parsed.Model, cacheSalt: parsed.CacheSalt, stream: parsed.Stream, ids: enc.IDs}, err
	}
	req, _, ids, err := s.promptTokens(ctx, body, api == tokenize.APIChat)
	if err != nil {
		return renderedPrompt{}, err
	}
	return renderedPrompt{model: req.Model, cacheSalt: req.CacheSalt, stream: req.Stream, ids: ids}, nil
}

// authorized reports whether r carries the render API key, if one is set. The
// comparison takes the same time wherever the first difference is.
func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.RenderAPIKey == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+s.cfg.RenderAPIKey)) == 1
}
