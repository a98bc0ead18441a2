package mockworker

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// generateRequest is vLLM's GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py),
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

// serveRender answers POST /v1/chat/completions/render (one GenerateRequest object) and
// /v1/completions/render (a list of them, one per prompt; a batch is rendered by its
// first prompt only, which is what kvroute reads) as vLLM does, with the prompt's ids
// as the worker itself computes them. A request the worker cannot render gets vLLM's
// 400. Config.RenderDelay makes it a slow render server; Config.RenderAPIKey makes it
// want an API key.
func (s *Server) serveRender(w http.ResponseWriter, r *http.Request, chat bool) {
	if !s.authorized(r) {
		// vLLM's AuthenticationMiddleware answers before reading the body.
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
		return
	}
	// The body is read first: only then does the server notice a client that hangs up
	// (and cancel r's context), which a delayed answer waits on.
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
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
	req, _, ids, err := s.promptTokens(r.Context(), body, chat)
	if err != nil || len(ids) == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprint("cannot render the prompt: ", err))
		return
	}
	maxTokens := s.cfg.DefaultMaxTokens
	var extra completionRequest
	if json.Unmarshal(body, &extra) == nil {
		for _, v := range []*int{extra.MaxTokens, extra.MaxCompletionTokens} {
			if v != nil && *v > 0 {
				maxTokens = *v
			}
		}
	}
	s.mu.Lock()
	id := s.nextID
	s.nextID++
	s.mu.Unlock()
	g := generateRequest{TokenIDs: ids, SamplingParams: map[string]any{"max_tokens": maxTokens}, Model: req.Model, Stream: req.Stream}
	if req.CacheSalt != "" {
		g.CacheSalt = &req.CacheSalt
	}
	var reply any
	if chat {
		g.RequestID = fmt.Sprintf("chatcmpl-%s-render-%d", s.cfg.Name, id)
		reply = g
	} else {
		g.RequestID = fmt.Sprintf("cmpl-%s-render-%d", s.cfg.Name, id)
		reply = []generateRequest{g}
	}
	b, err := json.Marshal(reply)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(b)
}

// authorized reports whether r carries the render API key, if one is set. The
// comparison takes the same time wherever the first difference is.
func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.RenderAPIKey == "" {
		return true
	}
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+s.cfg.RenderAPIKey)) == 1
}
