package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
)

// completionRequest is what the simulated worker reads of a request beyond its prompt
// (which openai.Parse reads, as kvroute's filter does).
type completionRequest struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           *int   `json:"max_tokens"`
	MaxCompletionTokens *int   `json:"max_completion_tokens"`
	StreamOptions       struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

// maxBody is the most of a request's body an endpoint reads.
const maxBody = 64 << 20

// writeError answers an error as vLLM's create_error_response does: its ErrorResponse,
// the type named after the status (BadRequestError for a 400) and the status as code.
func writeError(w http.ResponseWriter, status int, msg string) {
	typ := strings.ReplaceAll(http.StatusText(status), " ", "") + "Error" // BadRequestError, NotFoundError, …
	if status == http.StatusInternalServerError {
		typ = "InternalServerError"
	}
	writeErrorResponse(w, status, typ, msg, nil)
}

// writeErrorResponse answers vLLM's ErrorResponse of status: its type, message and
// param (nil for none), the status as code.
func writeErrorResponse(w http.ResponseWriter, status int, typ, msg string, param any) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": param, "code": status}})
	_, _ = w.Write(b)
}

// promptTokens reads, renders and tokenizes the request's prompt as kvroute's router
// does: the same parser and the model's prompt encoder, so both see the same token ids.
// It returns the encoder too, for the output words.
func (s *Server) promptTokens(ctx context.Context, body []byte, chat bool) (*openai.Request, tokenize.PromptEncoder, []uint32, error) {
	endpoint := openai.Completions
	if chat {
		endpoint = openai.ChatCompletions
	}
	req, err := openai.Parse(endpoint, body, openai.DefaultLimits())
	if err != nil {
		return nil, nil, nil, err
	}
	encoder := s.encoderOf(req.Model)
	if req.Tokens != nil {
		return &req, encoder, req.Tokens, nil
	}
	enc, err := encoder.EncodePrompt(ctx, tokenize.Prompt{Chat: req.Chat, Text: req.Prompt, Body: body, AddSpecialTokens: req.AddSpecialTokens})
	return &req, encoder, enc.IDs, err
}

// encoderOf returns the prompt encoder of a request naming model: vLLM encodes an
// adapter's prompts with its base model's tokenizer.
func (s *Server) encoderOf(model string) tokenize.PromptEncoder {
	if base, ok := s.cfg.LoRAAdapters[model]; ok {
		model = base
	}
	return s.tokenizers.Model(model)
}

// servesModel reports whether the worker serves a request naming model: one of its
// adapters, or a base model (any, without ServedModels).
func (s *Server) servesModel(model string) bool {
	if _, ok := s.cfg.LoRAAdapters[model]; ok {
		return true
	}
	return len(s.cfg.ServedModels) == 0 || slices.Contains(s.cfg.ServedModels, model)
}

// writeModelNotFound answers vLLM's 404 to a request naming a model (or LoRA adapter)
// it has not loaded.
func writeModelNotFound(w http.ResponseWriter, model string) {
	writeErrorResponse(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model), "model")
}

// prefillerOf returns the prefill worker's host:port that a request's header names
// for the sidecar (Config.PrefillSidecar; "" without it, or without the header). It
// reports false once it has answered a header that is not a host:port.
func (s *Server) prefillerOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	if !s.cfg.PrefillSidecar {
		return "", true
	}
	prefiller := r.Header.Get(s.cfg.PrefillerHeader)
	if err := checkHostPort(prefiller); prefiller != "" && err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("header %s: %q: want the prefill worker's host:port: %v", s.cfg.PrefillerHeader, prefiller, err))
		return "", false
	}
	return prefiller, true
}

// generation is a request the engine runs, as begin started it.
type generation struct {
	rk    *rank // the engine serving it
	sr    *sim.Request
	words []string // the output, one token each (sr.Output has their ids)
	ch    chan progress
	// remoteDecode: the request is a disaggregated request's prefill; its answer
	// tells the decode worker where the KV is (prefillParams).
	remoteDecode bool
}

// begin does what every endpoint serving vLLM's NIXL connector does once it has read
// its request: with prefiller (the sidecar's prefill worker) it has that worker
// prefill the body first (remotePrefill); a prompt whose KV a prefill worker computed,
// there or as the request's kv_transfer_params (kv, nil for none) say, waits for its
// transfer; then wk goes to the engine (wk.rank, or the balancer's). It sets
// x-served-by, x-data-parallel-rank and x-prefilled-by, and reports false once it has
// answered an error or the client went away.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, body []byte, prefiller string, wk work, kv *kvTransferParams) (*generation, bool) {
	// The prompt's KV comes from a prefill worker when the sidecar has one compute it,
	// or when the request says one did (as the sidecar sends it to vLLM). A request for
	// a remote decode is itself such a prefill: its answer says where the KV is.
	if kv == nil {
		kv = &kvTransferParams{}
	}
	remoteDecode, transferred, prefilledBy := kv.DoRemoteDecode, kv.DoRemotePrefill, engineID(kv.RemoteEngineID)
	if prefiller != "" {
		by, status, err := s.remotePrefill(r, body, prefiller)
		if err != nil {
			writeError(w, status, err.Error())
			return nil, false
		}
		remoteDecode, transferred, prefilledBy = false, true, by
	}
	if transferred && wk.rank == nil {
		// The balancer picks when the request reaches the engines, before its transfer.
		wk.rank = s.balance()
	}
	if transferred && !s.waitTransfer(r.Context(), wk) {
		return nil, false // the client went away
	}
	rk, sr, words, ch, err := s.submit(r.Context(), wk, transferred)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	w.Header().Set("x-served-by", s.cfg.Name)
	s.setServedRank(w, rk)
	if transferred && prefilledBy != "" {
		w.Header().Set("x-prefilled-by", prefilledBy)
	}
	return &generation{rk: rk, sr: sr, words: words, ch: ch, remoteDecode: remoteDecode}, true
}

// finished counts a finished generation that was a disaggregated request's prefill.
func (s *Server) finished(g *generation) {
	if g.remoteDecode {
		s.mu.Lock()
		g.rk.remotePrefills++
		s.mu.Unlock()
	}
}

// joined adapts an emitter of text to generate's emitter of output tokens: it gets
// the words of the tokens from up to to.
func joined(words []string, emit func(text string, finished bool)) func(from, to int, finished bool) {
	return func(from, to int, finished bool) { emit(strings.Join(words[from:to], ""), finished) }
}

func (s *Server) serveCompletion(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "cannot read the body")
		return
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	prefiller, ok := s.prefillerOf(w, r)
	if !ok {
		return
	}
	if !s.servesModel(req.Model) {
		writeModelNotFound(w, req.Model)
		return
	}
	parsed, encoder, prompt, err := s.promptTokens(r.Context(), body, chat)
	if err != nil || len(prompt) == 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprint("bad prompt: ", err))
		return
	}
	maxTokens, refusal := s.outputTokens(len(prompt), req.MaxTokens, req.MaxCompletionTokens)
	if refusal != "" {
		writeError(w, http.StatusBadRequest, refusal)
		return
	}
	lora := ""
	if _, ok := s.cfg.LoRAAdapters[parsed.Model]; ok {
		lora = parsed.Model
	}
	rk, err := s.pinnedRank(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g, ok := s.begin(w, r, body, prefiller, work{encoder: encoder, prompt: prompt, maxTokens: maxTokens, lora: lora, cacheSalt: parsed.CacheSalt, rank: rk}, req.KVTransferParams)
	if !ok {
		return
	}
	sr := g.sr
	id := fmt.Sprintf("cmpl-%s-%d", s.cfg.Name, sr.ID)
	object := map[bool]string{true: "chat.completion", false: "text_completion"}[chat]
	created := time.Now().Unix()

	var emit func(int, int, bool)
	if req.Stream {
		w.Header().Set("content-type", "text/event-stream")
		w.Header().Set("cache-control", "no-cache")
		emit = joined(g.words, func(text string, finished bool) {
			_, _ = w.Write(chunkEvent(id, object, req.Model, created, chat, text, finished))
		})
	}
	switch sent, end := s.generate(w, r, g.rk, sr, g.ch, emit); end {
	case generateGone:
		return
	case generateStopped:
		if !req.Stream && sent == 0 {
			writeError(w, http.StatusServiceUnavailable, "worker stopped")
		}
		return
	}
	u := usage(sr, req.Stream)
	s.finished(g)
	if !req.Stream {
		w.Header().Set("content-type", "application/json")
		choice := map[string]any{"index": 0, "finish_reason": "length"}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": strings.Join(g.words, "")}
		} else {
			choice["text"] = strings.Join(g.words, "")
		}
		answer := map[string]any{"id": id, "object": object, "created": created, "model": req.Model, "choices": []any{choice}, "usage": u}
		if g.remoteDecode {
			answer["kv_transfer_params"] = s.prefillParams(r.Host, len(sr.Prompt))
		}
		b, _ := json.Marshal(answer)
		_, _ = w.Write(b)
		return
	}
	if req.StreamOptions.IncludeUsage {
		// Chat chunks are chat.completion.chunk; a completions stream's, its usage chunk
		// too, text_completion (vLLM's CompletionStreamResponse).
		chunkObject := object
		if chat {
			chunkObject += ".chunk"
		}
		b, _ := json.Marshal(map[string]any{"id": id, "object": chunkObject, "created": created, "model": req.Model, "choices": []any{}, "usage": u})
		writeSSE(w, b)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// outputTokens is how many tokens a request of prompt tokens generates, given the
// output bounds it names (nil or ≤ 0: none; a later one wins, as vLLM prefers
// max_completion_tokens to max_tokens), or the words of vLLM's 400 refusing it: a prompt
// of max_model_len tokens or more, or a bound the context cannot hold beside the prompt.
// A request naming no bound gets the worker's default, but at most what the context
// leaves beside its prompt, as vLLM bounds it (max_model_len − prompt tokens): past the
// context, a long prompt's sequence could outgrow the KV cache and never be admitted.
func (s *Server) outputTokens(prompt int, bounds ...*int) (int, string) {
	if prompt >= s.cfg.MaxModelLen {
		// vLLM's words (serving_engine.py), from before it schedules anything.
		return 0, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the messages, Please reduce the length of the messages.", s.cfg.MaxModelLen, prompt)
	}
	maxTokens, bounded := s.cfg.DefaultMaxTokens, false
	for _, v := range bounds {
		if v != nil && *v > 0 {
			maxTokens, bounded = *v, true
		}
	}
	if !bounded {
		return min(maxTokens, s.cfg.MaxModelLen-prompt), ""
	}
	if prompt+maxTokens > s.cfg.MaxModelLen {
		// vLLM refuses a bound the context cannot hold beside the prompt, in the words
		// of the version whose refusal of a long prompt is above.
		return 0, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.cfg.MaxModelLen, prompt+maxTokens, prompt, maxTokens)
	}
	return maxTokens, ""
}

// How a generation ended (Server.generate).
const (
	generateFinished = iota // every token generated
	generateGone            // the client went away: the request was aborted
	generateStopped         // the worker stopped
)

// generate waits for sr's tokens. With emit, it streams them as they come: the first
// at once, later ones every TokensPerEvent tokens and at the end, each event (the
// output tokens from up to to) flushed. It returns the tokens generated (streamed,
// with emit) and how it ended. rk is the rank serving sr.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, rk *rank, sr *sim.Request, ch chan progress, emit func(from, to int, finished bool)) (sent, end int) {
	admitted := false
	flusher, _ := w.(http.Flusher)
	for {
		var p progress
		var ok bool
		select {
		case p, ok = <-ch:
		case <-r.Context().Done():
			s.abort(rk, sr)
			return sent, generateGone
		}
		if !ok {
			return sent, generateStopped
		}
		if !admitted {
			s.admitted(rk, sr)
			admitted = true
		}
		switch {
		case emit == nil:
			sent = p.generated
		case s.due(sent, p):
			emit(sent, p.generated, p.finished)
			if flusher != nil {
				flusher.Flush()
			}
			sent = p.generated
		}
		if p.finished {
			return sent, generateFinished
		}
	}
}

// due reports whether a stream that has sent tokens of its output sends an event at
// p: the first tokens at once, later ones every TokensPerEvent tokens and at the end.
func (s *Server) due(sent int, p progress) bool {
	return p.generated > sent && (sent == 0 || p.generated-sent >= s.cfg.TokensPerEvent || p.finished)
}

// usage is r's usage object as vLLM started with --enable-prompt-tokens-details writes
// it: prompt_tokens_details only when some prompt tokens were cached (its truthiness
// check on num_cached_tokens), else null in a whole answer (model_dump) and absent from
// a stream's usage chunk (model_dump_json with exclude_none).
func usage(r *sim.Request, stream bool) map[string]any {
	return usageOf(len(r.Prompt), len(r.Output), cachedTokens(r), stream)
}

// usageOf is usage of prompt, completion and cached token counts.
func usageOf(prompt, completion, cached int, stream bool) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	switch {
	case cached > 0:
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	case !stream:
		u["prompt_tokens_details"] = nil
	}
	return u
}

// tokenIDs is a prompt of token ids as a request gave them, already checked to be
// in uint32's range.
func tokenIDs(ids []int64) []uint32 {
	prompt := make([]uint32, len(ids))
	for i, id := range ids {
		prompt[i] = uint32(id)
	}
	return prompt
}

// cachedTokens is the cached_tokens vLLM reports for r: every prompt token it did not
// compute at first admission, from its own prefix cache and from a KV connector alike
// (num_cached_tokens is num_computed_tokens, local plus external, at first scheduling:
// vllm/v1/core/sched/scheduler.py): the device's hits, the host tier's loads and a
// prefill worker's transfer. vllm:prefix_cache_hits counts the device's alone.
func cachedTokens(r *sim.Request) int { return r.CachedTokens + r.HostTokens + r.TransferredTokens }

// chunkEvent is one streamed token's SSE event, "data: {…}\n\n", with the fields
// encoding/json would write for it, in the same (sorted) order. It is built by
// appending rather than by marshalling maps: it runs once per token of every stream,
// and in the load test it was the harness's largest cost.
func chunkEvent(id, object, model string, created int64, chat bool, text string, finished bool) []byte {
	b := make([]byte, 0, 224+len(id)+len(model)+len(text))
	b = append(b, `data: {"choices":[{`...)
	if chat {
		b = append(b, `"delta":{"content":`...)
		b = jsonv.AppendQuoted(b, text, false)
		b = append(b, `,"role":"assistant"},`...)
		object += ".chunk"
	}
	b = append(b, `"finish_reason":`...)
	if finished {
		b = append(b, `"length"`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"index":0`...)
	if !chat {
		b = append(b, `,"text":`...)
		b = jsonv.AppendQuoted(b, text, false)
	}
	b = append(b, `}],"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"id":`...)
	b = jsonv.AppendQuoted(b, id, false)
	b = append(b, `,"model":`...)
	b = jsonv.AppendQuoted(b, model, false)
	b = append(b, `,"object":`...)
	b = jsonv.AppendQuoted(b, object, false)
	return append(b, "}\n\n"...)
}

func writeSSE(w io.Writer, b []byte) {
	_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
}
