package mockworker

// Generation for the two APIs vLLM serves by converting the body to a chat: Anthropic's
// Messages API (POST /v1/messages, vllm/entrypoints/anthropic) and OpenAI's Responses
// API (POST /v1/responses, vllm/entrypoints/openai/responses), answered in their own
// shapes. The prompt is the chat vLLM renders for the body, rebuilt as kvroute rebuilds
// it (renderPrompt: openai.MessagesChat, openai.ResponsesChat), so the engine's blocks
// are the ones kvroute hashes. The worker keeps no response: a Responses body naming a
// previous_response_id, or asking to store or run in the background, is refused (400);
// send store false with the whole conversation, as Codex does.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
)

// convertedRequest is what the worker reads of a Messages or Responses body beyond
// its prompt.
type convertedRequest struct {
	MaxTokens          *int    `json:"max_tokens"`        // Messages (required there)
	MaxOutputTokens    *int    `json:"max_output_tokens"` // Responses
	Instructions       *string `json:"instructions"`      // Responses: echoed in the response
	PreviousResponseID *string `json:"previous_response_id"`
	Background         bool    `json:"background"`
}

// serveConverted serves POST /v1/messages (api tokenize.APIMessages) or POST
// /v1/responses (tokenize.APIResponses): the prompt rendered as vLLM renders it, then
// generated as a chat completion is, the answer and its SSE events in the API's shape
// with its usage (Messages: input_tokens without the cache reads, and
// cache_read_input_tokens; Responses: input_tokens with
// input_tokens_details.cached_tokens). Errors on /v1/messages are Anthropic-shaped.
func (s *Server) serveConverted(w http.ResponseWriter, r *http.Request, api tokenize.API) {
	messages := api == tokenize.APIMessages
	fail := func(status int, typ, msg string) {
		if !messages {
			writeError(w, status, msg)
			return
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(status)
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
		_, _ = w.Write(b)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		fail(http.StatusBadRequest, "invalid_request_error", "cannot read the body")
		return
	}
	var req convertedRequest
	if err := json.Unmarshal(body, &req); err != nil {
		fail(http.StatusBadRequest, "invalid_request_error", "invalid JSON: "+err.Error())
		return
	}
	if !messages {
		store, err := openai.ParseResponses(body, openai.DefaultLimits())
		switch {
		case err != nil:
			fail(http.StatusBadRequest, "", err.Error())
			return
		case store.PreviousResponseID != "" || store.Store || store.Background:
			fail(http.StatusBadRequest, "", "the mock worker keeps no responses: send store false, no previous_response_id and no background")
			return
		}
	}
	p, err := s.renderPrompt(r.Context(), body, api)
	if err != nil || len(p.ids) == 0 {
		fail(http.StatusBadRequest, "invalid_request_error", fmt.Sprint("bad prompt: ", err))
		return
	}
	if !s.servesModel(p.model) {
		fail(http.StatusNotFound, "not_found_error", fmt.Sprintf("The model `%s` does not exist.", p.model))
		return
	}
	maxTokens, refusal := s.outputTokens(len(p.ids), req.MaxTokens, req.MaxOutputTokens)
	if refusal != "" {
		fail(http.StatusBadRequest, "invalid_request_error", refusal)
		return
	}
	lora := ""
	if _, ok := s.cfg.LoRAAdapters[p.model]; ok {
		lora = p.model
	}
	var pinned *rank
	if messages {
		// vLLM's Messages endpoint is its chat's, which reads the rank header; its
		// Responses endpoint does not read it (the balancer picks).
		var err error
		if pinned, err = s.pinnedRank(r); err != nil {
			fail(http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
	}
	rk, sr, words, ch, err := s.submit(r.Context(), work{encoder: s.encoderOf(p.model), prompt: p.ids, maxTokens: maxTokens, lora: lora, cacheSalt: p.cacheSalt, rank: pinned}, false)
	if err != nil {
		fail(http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	w.Header().Set("x-served-by", s.cfg.Name)
	s.setServedRank(w, rk)
	a := &convertedAnswer{w: w, model: p.model, req: req, created: time.Now().Unix(), sr: sr}
	if messages {
		a.id = fmt.Sprintf("msg_%s-%d", s.cfg.Name, sr.ID)
	} else {
		a.id = fmt.Sprintf("resp_%s-%d", s.cfg.Name, sr.ID)
		a.itemID = fmt.Sprintf("msg_%s-%d", s.cfg.Name, sr.ID)
	}
	var emit func(int, int, bool)
	if p.stream {
		w.Header().Set("content-type", "text/event-stream; charset=utf-8")
		w.Header().Set("cache-control", "no-cache")
		emit = joined(words, a.messagesDelta)
		if !messages {
			emit = joined(words, a.responsesDelta)
		}
	}
	switch sent, end := s.generate(w, r, rk, sr, ch, emit); end {
	case generateGone:
		return
	case generateStopped:
		if !p.stream && sent == 0 {
			fail(http.StatusServiceUnavailable, "api_error", "worker stopped")
		}
		return
	}
	text := strings.Join(words, "")
	switch {
	case messages && p.stream:
		a.messagesEnd()
	case messages:
		w.Header().Set("content-type", "application/json")
		b, _ := json.Marshal(a.message(text))
		_, _ = w.Write(b)
	case p.stream:
		a.responsesEnd(text)
	default:
		w.Header().Set("content-type", "application/json")
		b, _ := json.Marshal(a.response("completed", text))
		_, _ = w.Write(b)
	}
}

// convertedAnswer writes one Messages or Responses answer.
type convertedAnswer struct {
	w          http.ResponseWriter
	id, itemID string
	model      string
	req        convertedRequest
	created    int64
	sr         *sim.Request
	started    bool // the opening events are out
	seq        int  // the Responses events' sequence_number
}

// event writes one named SSE event.
func (a *convertedAnswer) event(name string, data any) {
	b, _ := json.Marshal(data)
	_, _ = fmt.Fprintf(a.w, "event: %s\ndata: %s\n\n", name, b)
}

// messagesUsage is vLLM's _build_anthropic_usage: Anthropic counts cache reads apart
// from input_tokens.
func (a *convertedAnswer) messagesUsage(output int) map[string]any {
	cached := cachedTokens(a.sr)
	return map[string]any{"input_tokens": len(a.sr.Prompt) - cached, "output_tokens": output, "cache_read_input_tokens": cached}
}

// message is the whole Messages answer.
func (a *convertedAnswer) message(text string) map[string]any {
	return map[string]any{"id": a.id, "type": "message", "role": "assistant", "model": a.model,
		"content":     []any{map[string]any{"type": "text", "text": text}},
		"stop_reason": "max_tokens", "stop_sequence": nil, "usage": a.messagesUsage(len(a.sr.Output))}
}

// messagesDelta streams text as a content_block_delta, opening the message and its
// text block first.
func (a *convertedAnswer) messagesDelta(text string, _ bool) {
	if !a.started {
		a.started = true
		a.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": a.id, "type": "message", "role": "assistant", "model": a.model, "content": []any{},
			"stop_reason": nil, "stop_sequence": nil, "usage": a.messagesUsage(0)}})
		a.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "text", "text": ""}})
	}
	// Built by appending, as chunkEvent: it runs once per event of every stream.
	b := make([]byte, 0, 128+len(text))
	b = append(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"...)
	b = jsonv.AppendQuoted(b, text, false)
	_, _ = a.w.Write(append(b, "}}\n\n"...))
}

// messagesEnd closes the text block and the message, with its usage.
func (a *convertedAnswer) messagesEnd() {
	a.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	a.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "max_tokens", "stop_sequence": nil}, "usage": a.messagesUsage(len(a.sr.Output))})
	a.event("message_stop", map[string]any{"type": "message_stop"})
}

// response is vLLM's ResponsesResponse in the given status: its instructions echoed,
// the output message and usage once completed.
func (a *convertedAnswer) response(status, text string) map[string]any {
	maxOutput := any(nil)
	if a.req.MaxOutputTokens != nil {
		maxOutput = *a.req.MaxOutputTokens
	}
	r := map[string]any{"id": a.id, "created_at": a.created, "incomplete_details": nil, "instructions": a.req.Instructions,
		"metadata": nil, "model": a.model, "object": "response", "output": []any{}, "parallel_tool_calls": true,
		"temperature": 1.0, "tool_choice": "auto", "tools": []any{}, "top_p": 1.0, "background": false,
		"max_output_tokens": maxOutput, "previous_response_id": nil, "reasoning": nil, "service_tier": "auto",
		"status": status, "text": nil, "truncation": "disabled", "usage": nil, "user": nil}
	if status == "completed" {
		prompt, cached, output := len(a.sr.Prompt), cachedTokens(a.sr), len(a.sr.Output)
		r["output"] = []any{a.outputItem("completed", text)}
		r["usage"] = map[string]any{"input_tokens": prompt, "input_tokens_details": map[string]any{"cached_tokens": cached},
			"output_tokens": output, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": prompt + output}
	}
	return r
}

func (a *convertedAnswer) outputItem(status, text string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{outputText(text)}
	}
	return map[string]any{"id": a.itemID, "content": content, "role": "assistant", "status": status, "type": "message"}
}

func outputText(text string) map[string]any {
	return map[string]any{"annotations": []any{}, "text": text, "type": "output_text"}
}

// responsesEvent writes one Responses event: its type and sequence_number added.
func (a *convertedAnswer) responsesEvent(typ string, fields map[string]any) {
	fields["type"], fields["sequence_number"] = typ, a.seq
	a.seq++
	a.event(typ, fields)
}

// at adds the output message's place to a Responses event.
func (a *convertedAnswer) at(fields map[string]any) map[string]any {
	fields["output_index"] = 0
	if _, ok := fields["item"]; !ok {
		fields["item_id"], fields["content_index"] = a.itemID, 0
	}
	return fields
}

// responsesDelta streams text as a response.output_text.delta, opening the response,
// its output message and its text part first, as vLLM does.
func (a *convertedAnswer) responsesDelta(text string, _ bool) {
	if !a.started {
		a.started = true
		a.responsesEvent("response.created", map[string]any{"response": a.response("in_progress", "")})
		a.responsesEvent("response.in_progress", map[string]any{"response": a.response("in_progress", "")})
		a.responsesEvent("response.output_item.added", a.at(map[string]any{"item": a.outputItem("in_progress", "")}))
		a.responsesEvent("response.content_part.added", a.at(map[string]any{"part": outputText("")}))
	}
	// Built by appending, as chunkEvent: it runs once per event of every stream.
	b := make([]byte, 0, 192+len(a.itemID)+len(text))
	b = append(b, "event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":"...)
	b = jsonv.AppendQuoted(b, text, false)
	b = append(b, `,"item_id":`...)
	b = jsonv.AppendQuoted(b, a.itemID, false)
	b = append(b, `,"logprobs":[],"output_index":0,"sequence_number":`...)
	b = strconv.AppendInt(b, int64(a.seq), 10)
	a.seq++
	_, _ = a.w.Write(append(b, ",\"type\":\"response.output_text.delta\"}\n\n"...))
}

// responsesEnd closes the text part and the output message, and completes the
// response with its usage (vLLM sends no [DONE]).
func (a *convertedAnswer) responsesEnd(text string) {
	a.responsesEvent("response.output_text.done", a.at(map[string]any{"text": text, "logprobs": []any{}}))
	a.responsesEvent("response.content_part.done", a.at(map[string]any{"part": outputText(text)}))
	a.responsesEvent("response.output_item.done", a.at(map[string]any{"item": a.outputItem("completed", text)}))
	a.responsesEvent("response.completed", map[string]any{"response": a.response("completed", text)})
}
