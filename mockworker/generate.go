package mockworker

// vLLM's token-in/token-out API, POST /inference/v1/generate (vllm/entrypoints/serve/
// disagg: api_router.py, protocol.py, serving.py's ServingTokens.serve_tokens), as RL
// rollout frameworks use it for multi-turn rollouts: the prompt is token ids, the
// answer the generated token ids. The prompt runs through the engine as a completion
// with a token-id prompt does (prefix cache, scheduler, KV events, metrics, cache_salt,
// LoRA adapters, kv_transfer_params and the sidecar alike); nothing is tokenized but
// the output words, as every endpoint's are, so the output ids are the served model's.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/sim"
)

// generatePath is vLLM's token-in generate endpoint.
const generatePath = "/inference/v1/generate"

// generateBody is what the worker reads of vLLM's GenerateRequest. Fields it does not
// read (priority, logprobs and the other sampling parameters) are taken and ignored.
type generateBody struct {
	RequestID      *string `json:"request_id"`
	TokenIDs       []int64 `json:"token_ids"`
	SamplingParams struct {
		MaxTokens *int `json:"max_tokens"`
		N         *int `json:"n"`
	} `json:"sampling_params"`
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage         *bool `json:"include_usage"`
		ContinuousUsageStats *bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	CacheSalt        *string           `json:"cache_salt"`
	Features         json.RawMessage   `json:"features"`
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

// validationError is a body pydantic would refuse: the field (its loc after "body")
// and pydantic's error type and words.
type validationError struct{ field, typ, msg string }

func (e *validationError) Error() string { return e.field + ": " + e.msg }

// pydanticType names pydantic's error of a value that is not of kind: its type and
// words.
func pydanticType(kind reflect.Kind) (typ, msg string) {
	switch kind {
	case reflect.Int, reflect.Int64:
		return "int_type", "Input should be a valid integer"
	case reflect.Bool:
		return "bool_type", "Input should be a valid boolean"
	case reflect.String:
		return "string_type", "Input should be a valid string"
	case reflect.Slice:
		return "list_type", "Input should be a valid list"
	}
	return "dict_type", "Input should be a valid dictionary"
}

// writeValidationError answers as vLLM's handler of a RequestValidationError does:
// 400, type "Bad Request", the field's loc as param, and the errors listed in the
// message (without the input pydantic echoes).
func writeValidationError(w http.ResponseWriter, e *validationError) {
	loc, param := "'body',", "body"
	if e.field != "" {
		loc, param = "'body'", "body."+e.field
		for _, part := range strings.Split(e.field, ".") {
			loc += ", '" + part + "'"
		}
	}
	msg := fmt.Sprintf("1 validation error:\n  {'type': '%s', 'loc': (%s), 'msg': '%s'}", e.typ, loc, e.msg)
	writeErrorResponse(w, http.StatusBadRequest, "Bad Request", msg, param)
}

// parseGenerate reads a GenerateRequest as vLLM's pydantic model validates it:
// token_ids a non-empty list of non-negative integers and sampling_params an object,
// both required; the optional fields of their types or null; sampling_params'
// max_tokens at least 1 and n at least 1 when set (SamplingParams' own checks).
func parseGenerate(body []byte) (*generateBody, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, &validationError{field: "", typ: "model_attributes_type", msg: "Input should be a valid dictionary or object to extract fields from"}
	}
	for _, f := range []struct{ name, typ, msg string }{
		{"token_ids", "list_type", "Input should be a valid list"},
		{"sampling_params", "model_type", "Input should be a valid dictionary or instance of SamplingParams"},
	} {
		switch raw, ok := fields[f.name]; {
		case !ok:
			return nil, &validationError{field: f.name, typ: "missing", msg: "Field required"}
		case string(raw) == "null":
			return nil, &validationError{field: f.name, typ: f.typ, msg: f.msg}
		}
	}
	var req generateBody
	if err := json.Unmarshal(body, &req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			typ, msg := pydanticType(typeErr.Type.Kind())
			return nil, &validationError{field: typeErr.Field, typ: typ, msg: msg}
		}
		return nil, &validationError{field: "", typ: "json_invalid", msg: err.Error()}
	}
	if len(req.TokenIDs) == 0 {
		return nil, &validationError{field: "token_ids", typ: "too_short", msg: "List should have at least 1 item after validation, not 0"}
	}
	for _, id := range req.TokenIDs {
		if id < 0 {
			return nil, &validationError{field: "token_ids", typ: "value_error", msg: "Value error, token_ids must not contain negative values"}
		}
		if id > math.MaxUint32 {
			return nil, &validationError{field: "token_ids", typ: "value_error", msg: fmt.Sprintf("Value error, token id %d is out of vocabulary", id)}
		}
	}
	sp := req.SamplingParams
	if sp.MaxTokens != nil && *sp.MaxTokens < 1 {
		return nil, &validationError{field: "sampling_params", typ: "value_error", msg: fmt.Sprintf("Value error, max_tokens must be at least 1, got %d.", *sp.MaxTokens)}
	}
	if sp.N != nil && *sp.N < 1 {
		return nil, &validationError{field: "sampling_params", typ: "value_error", msg: fmt.Sprintf("Value error, n must be at least 1, got %d.", *sp.N)}
	}
	return &req, nil
}

// serveGenerate serves POST /inference/v1/generate as vLLM's serve_tokens does: the
// model checked (none: the served model; an unknown one: 404), the output bounded by
// sampling_params.max_tokens or, without it, fitted to the context (the worker's
// DefaultMaxTokens plays the generation config's default, at most max_model_len − the
// prompt), and a bound past the context cut short at it (finish_reason length), as
// the engine stops a request at max_model_len: generate does not refuse it as the
// OpenAI endpoints do. The answer is a GenerateResponse, or streamed
// GenerateStreamResponse chunks of token ids with the usage chunk of
// stream_options.include_usage and data: [DONE]. sampling_params.n above 1 runs n
// samples as vLLM v1's parallel sampling does (serveSamples); n above the engine's
// max_num_seqs gets vLLM's 400, as does, here, n above 1 with disaggregation
// (kv_transfer_params or the sidecar's prefill worker) and multimodal input
// (features).
func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "cannot read the body")
		return
	}
	req, err := parseGenerate(body)
	if err != nil {
		writeValidationError(w, err.(*validationError))
		return
	}
	prefiller, ok := s.prefillerOf(w, r)
	if !ok {
		return
	}
	model := ""
	if req.Model != nil {
		model = *req.Model
	}
	if model != "" && !s.servesModel(model) {
		writeModelNotFound(w, model)
		return
	}
	samples := 1
	if req.SamplingParams.N != nil {
		samples = *req.SamplingParams.N
	}
	switch {
	case samples > s.cfg.Engine.MaxNumSeqs:
		// vLLM's serve_tokens refuses it before it schedules anything: the n child
		// requests could never all run.
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sampling_params.n must be at most the server's max_num_seqs (%d), got %d.", s.cfg.Engine.MaxNumSeqs, samples))
		return
	case samples > 1 && (prefiller != "" || req.KVTransferParams != nil):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the mock worker disaggregates one sequence a request: sampling_params.n must be 1 with kv_transfer_params or a prefill worker, got %d", samples))
		return
	case len(req.Features) > 0 && string(req.Features) != "null":
		writeError(w, http.StatusBadRequest, "the mock worker serves no multimodal input: features must be null")
		return
	}
	prompt := tokenIDs(req.TokenIDs)
	maxTokens, refusal := s.outputTokens(len(prompt))
	if refusal != "" {
		writeError(w, http.StatusBadRequest, refusal)
		return
	}
	if n := req.SamplingParams.MaxTokens; n != nil {
		maxTokens = min(*n, s.cfg.MaxModelLen-len(prompt))
	}
	// vLLM names the answer's model as models.model_name does: the adapter, or the
	// first served model whatever base name the request gave. A worker without
	// ServedModels serves any name, so it answers with the one named.
	lora, answerModel := "", model
	switch _, adapter := s.cfg.LoRAAdapters[model]; {
	case adapter:
		lora = model
	case len(s.cfg.ServedModels) > 0:
		answerModel = s.cfg.ServedModels[0]
	case model == "":
		answerModel = "mock"
	}
	cacheSalt := ""
	if req.CacheSalt != nil {
		cacheSalt = *req.CacheSalt
	}
	rk, err := s.pinnedRank(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	wk := work{encoder: s.encoderOf(answerModel), prompt: prompt, maxTokens: maxTokens, lora: lora, cacheSalt: cacheSalt, rank: rk}
	if samples > 1 {
		s.serveSamples(w, r, req, wk, samples, answerModel)
		return
	}
	g, ok := s.begin(w, r, body, prefiller, wk, req.KVTransferParams)
	if !ok {
		return
	}
	sr := g.sr
	id := s.generateID(r, req, sr)
	stream := req.Stream != nil && *req.Stream
	includeUsage, continuousUsage := req.usageOptions()
	created := time.Now().Unix()

	var emit func(int, int, bool)
	if stream {
		w.Header().Set("content-type", "text/event-stream; charset=utf-8")
		w.Header().Set("cache-control", "no-cache")
		emit = func(from, to int, finished bool) {
			_, _ = w.Write(generateChunk(id, 0, sr.Output[from:to], finished, continuousUsage, len(sr.Prompt), to))
		}
	}
	switch sent, end := s.generate(w, r, g.rk, sr, g.ch, emit); end {
	case generateGone:
		return
	case generateStopped:
		if !stream && sent == 0 {
			writeError(w, http.StatusServiceUnavailable, "worker stopped")
		}
		return
	}
	u := usage(sr, stream)
	s.finished(g)
	var kv any
	if !stream && g.remoteDecode {
		kv = s.prefillParams(r.Host, len(sr.Prompt))
	}
	finishGenerate(w, generateEnd{stream: stream, includeUsage: includeUsage, id: id, model: answerModel, created: created,
		outputs: [][]uint32{sr.Output}, usage: u, kvTransfer: kv})
}

// generateEnd is what ends a generate answer: the whole answer's fields, or a stream's
// usage chunk.
type generateEnd struct {
	stream, includeUsage bool
	id, model            string
	created              int64
	outputs              [][]uint32 // each choice's token ids, by index
	usage                any
	kvTransfer           any
}

// finishGenerate writes the end of a generate answer: the whole GenerateResponse (one
// choice per output) when not streamed, else the usage chunk (include_usage) and
// [DONE].
func finishGenerate(w http.ResponseWriter, e generateEnd) {
	if !e.stream {
		choices := make([]any, len(e.outputs))
		for i, out := range e.outputs {
			choices[i] = map[string]any{"index": i, "logprobs": nil, "finish_reason": "length", "token_ids": out, "routed_experts": nil}
		}
		b, _ := json.Marshal(map[string]any{"request_id": e.id, "model": e.model, "created": e.created, "choices": choices,
			"usage": e.usage, "prompt_logprobs": nil, "kv_transfer_params": e.kvTransfer, "ec_transfer_params": nil})
		w.Header().Set("content-type", "application/json")
		_, _ = w.Write(b)
		return
	}
	if e.includeUsage {
		// The usage chunk is dumped with exclude_none: no logprobs, no null details.
		b, _ := json.Marshal(map[string]any{"request_id": e.id, "choices": []any{}, "usage": e.usage})
		writeSSE(w, b)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// generateID is vLLM's id of a generate request: generate-tokens- and the
// x-request-id header, else the body's request_id (a random uuid when absent; here
// the worker's name and the engine request's id).
func (s *Server) generateID(r *http.Request, req *generateBody, sr *sim.Request) string {
	base := r.Header.Get("x-request-id")
	if base == "" && req.RequestID != nil {
		base = *req.RequestID
	}
	if base == "" {
		base = fmt.Sprintf("%s-%d", s.cfg.Name, sr.ID)
	}
	return "generate-tokens-" + base
}

// usageOptions reads stream_options: include_usage, and continuous_usage_stats with
// it.
func (req *generateBody) usageOptions() (include, continuous bool) {
	if o := req.StreamOptions; o != nil && o.IncludeUsage != nil && *o.IncludeUsage {
		return true, o.ContinuousUsageStats != nil && *o.ContinuousUsageStats
	}
	return false, false
}

// serveSamples serves a generate request of n > 1 samples as vLLM v1's parallel
// sampling does (vllm/v1/engine/parallel_sampling.py, ParentRequest): n child
// requests of the same prompt and parameters, each an engine request of its own with
// a batch slot of its own (the scheduler's running and waiting count each), sharing
// the prompt's blocks through the prefix cache as any requests of one prefix do.
// The answer (ServingTokens) has a choice per child, index 0..n-1; a stream's chunks
// each carry one choice's new token ids and its index (continuous usage: that
// choice's tokens). The usage counts the prompt once and the children's completion
// tokens summed; cached_tokens is one child's, as vLLM's RequestOutput carries the
// num_cached_tokens of the child whose output it is: the last to finish in a whole
// answer, the first to emit in a stream. A client that goes away aborts every child.
func (s *Server) serveSamples(w http.ResponseWriter, r *http.Request, req *generateBody, wk work, n int, answerModel string) {
	children := make([]*sim.Request, n)
	ranks := make([]*rank, n) // each child's: the balancer picks for each, as vLLM's does
	chans := make([]chan progress, n)
	for i := range children {
		rk, sr, _, ch, err := s.submit(r.Context(), wk, false)
		if err != nil {
			for j, c := range children[:i] {
				s.abort(ranks[j], c)
			}
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		children[i], ranks[i], chans[i] = sr, rk, ch
	}
	w.Header().Set("x-served-by", s.cfg.Name)
	if len(s.ranks) > 1 {
		ids := make([]string, n)
		for i, rk := range ranks {
			ids[i] = strconv.Itoa(rk.id)
		}
		w.Header().Set(rankHeader, strings.Join(ids, ","))
	}
	id := s.generateID(r, req, children[0])
	stream := req.Stream != nil && *req.Stream
	includeUsage, continuousUsage := req.usageOptions()
	created := time.Now().Unix()
	if stream {
		w.Header().Set("content-type", "text/event-stream; charset=utf-8")
		w.Header().Set("cache-control", "no-cache")
	}

	// One goroutine a child forwards its progress, so the events go out in the order
	// the engine made them, one writer at a time.
	type childProgress struct {
		i      int
		p      progress
		closed bool
	}
	merged := make(chan childProgress, n)
	done := make(chan struct{})
	defer close(done)
	for i, ch := range chans {
		go func() {
			for {
				select {
				case p, ok := <-ch:
					select {
					case merged <- childProgress{i: i, p: p, closed: !ok}:
					case <-done:
						return
					}
					if !ok || p.finished {
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	flusher, _ := w.(http.Flusher)
	sent := make([]int, n)
	admitted := make([]bool, n)
	finished := make([]bool, n)
	cachedFrom := -1 // the child whose cached_tokens the usage reports
	anySent := false
	for left := n; left > 0; {
		var c childProgress
		select {
		case c = <-merged:
		case <-r.Context().Done():
			for i, sr := range children {
				if !finished[i] {
					s.abort(ranks[i], sr)
				}
			}
			return
		}
		if c.closed {
			if !anySent {
				writeError(w, http.StatusServiceUnavailable, "worker stopped")
			}
			return
		}
		i, p := c.i, c.p
		if !admitted[i] {
			s.admitted(ranks[i], children[i])
			admitted[i] = true
		}
		if stream && s.due(sent[i], p) {
			if cachedFrom < 0 {
				cachedFrom = i
			}
			_, _ = w.Write(generateChunk(id, i, children[i].Output[sent[i]:p.generated], p.finished, continuousUsage, len(wk.prompt), p.generated))
			if flusher != nil {
				flusher.Flush()
			}
			sent[i], anySent = p.generated, true
		}
		if p.finished {
			finished[i] = true
			left--
			if !stream {
				cachedFrom = i
			}
		}
	}
	completion := 0
	for _, sr := range children {
		completion += len(sr.Output)
	}
	u := usageOf(len(wk.prompt), completion, cachedTokens(children[max(cachedFrom, 0)]), stream)
	outputs := make([][]uint32, n)
	for i, sr := range children {
		outputs[i] = sr.Output
	}
	finishGenerate(w, generateEnd{stream: stream, includeUsage: includeUsage, id: id, model: answerModel, created: created,
		outputs: outputs, usage: u})
}

// generateChunk is one streamed event of the generate API, "data: {…}\n\n": a
// GenerateStreamResponse of the new token ids of the choice of index (0, or a parallel
// sample's) as vLLM dumps it (model_dump_json, nulls and all, in its fields' order),
// with the usage so far when continuous is set. It is built by appending, as
// chunkEvent is: it runs once per event of every stream.
func generateChunk(id string, index int, ids []uint32, finished, continuous bool, prompt, generated int) []byte {
	b := make([]byte, 0, 192+len(id)+11*len(ids))
	b = append(b, `data: {"request_id":`...)
	b = jsonv.AppendQuoted(b, id, false)
	b = append(b, `,"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if finished {
		b = append(b, `"length"`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"token_ids":[`...)
	for i, t := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"routed_experts":null}],"usage":`...)
	if continuous {
		b = append(b, `{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt+generated), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(generated), 10)
		b = append(b, `,"prompt_tokens_details":null}`...)
	} else {
		b = append(b, "null"...)
	}
	return append(b, "}\n\n"...)
}
