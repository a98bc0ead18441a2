package mockworker

// SGLang's native generate API, POST /generate (sglang/srt/entrypoints/http_server.py's
// generate_request, io_struct.py's GenerateReqInput, tokenizer_manager.py), as RL
// frameworks (slime, AReaL, verl's server mode) and SGLang's own router use it. The
// prompt is text (tokenized as a completions prompt, special tokens added, no chat
// template: _tokenize_texts) or input_ids (which win when both are given:
// _tokenize_one_request); it runs through the engine as generate.go's token-id prompt
// does (prefix cache, scheduler, KV events, metrics, cache_salt, LoRA adapters). The
// answer is SGLang's out dict, {"text", "output_ids", "meta_info"}, or SSE chunks of it
// as SGLang streams without --incremental-streaming-output: each chunk the text and
// output ids so far, then data: [DONE].
//
// Not served (a 400 saying so): batches (a list of texts, a list of id lists) and
// parallel samples (sampling_params.n above 1), which SGLang fans out into one request
// each; multimodal data; max_new_tokens 0 (SGLang prefills only; the engine needs an
// output token). PD disaggregation's bootstrap_* fields, routed_dp_rank,
// return_logprob and the other sampling parameters are taken and ignored.
// session_params continue a session's history (sglang_session.go); since batches and
// n above 1 are refused, a session's request is always one prompt.

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/tokenize"
)

// sglangGeneratePath is SGLang's native generate endpoint.
const sglangGeneratePath = "/generate"

// sglangDefaultMaxNewTokens is SamplingParams.max_new_tokens' default
// (sglang/srt/sampling/sampling_params.py).
const sglangDefaultMaxNewTokens = 128

// sglangBody is what the worker reads of a GenerateReqInput. The union-typed fields
// (str or list, dict or list) are read raw and told apart as normalize_batch_and_arguments
// does.
type sglangBody struct {
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	InputEmbeds    json.RawMessage `json:"input_embeds"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	Stream         *bool           `json:"stream"`
	RID            json.RawMessage `json:"rid"`
	LoRAPath       json.RawMessage `json:"lora_path"`
	CacheSalt      json.RawMessage `json:"cache_salt"`
	ImageData      json.RawMessage `json:"image_data"`
	VideoData      json.RawMessage `json:"video_data"`
	AudioData      json.RawMessage `json:"audio_data"`
	SessionParams  json.RawMessage `json:"session_params"`
	SessionID      json.RawMessage `json:"session_id"`
}

// sglangValueError is a ValueError SGLang raises while it normalizes, tokenizes or
// validates a request: a 400 {"error": {"message"}} (http_server.py's
// _create_error_response), or, in a stream, a data: {"error": …} event after a 200.
type sglangValueError string

// writeSGLangValidationError answers a body FastAPI could not read into a
// GenerateReqInput as SGLang's RequestValidationError handler does: 400 and its
// ErrorResponse (object "error", type "Bad Request", code 400).
func writeSGLangValidationError(w http.ResponseWriter, msg string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	b, _ := json.Marshal(map[string]any{"object": "error", "message": msg, "type": "Bad Request", "param": nil, "code": http.StatusBadRequest})
	_, _ = w.Write(b)
}

// writeSGLangError answers a ValueError's 400 (sglangError).
func writeSGLangError(w http.ResponseWriter, msg string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(sglangError(msg))
}

// sglangError is SGLang's body of a ValueError, whole or as a stream's event.
func sglangError(msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg}})
	return b
}

// isNull reports a field absent or null.
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// sglangString reads an optional str field: "" when absent or null, ok false when it
// is not a string.
func sglangString(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", true
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

// sglangRequest is a single GenerateReqInput as the worker serves it.
type sglangRequest struct {
	text         *string
	ids          []int64
	maxNewTokens *int // nil: null, no bound but the context
	defaultBound bool // maxNewTokens is the default, not the body's: trimmed, never refused
	stream       bool
	rid, lora    string
	cacheSalt    string
	session      *sglangSessionParams // nil: no session
}

// parseSGLang reads body as FastAPI and normalize_batch_and_arguments would. A
// *validation* error (the body is no GenerateReqInput) comes back as validation; a
// ValueError of SGLang's, or a refusal of the worker's, as the value error.
func parseSGLang(body []byte) (req sglangRequest, validation string, valueErr sglangValueError) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return req, "the body is not a JSON object: a GenerateReqInput", ""
	}
	var b sglangBody
	if err := json.Unmarshal(body, &b); err != nil {
		return req, "invalid GenerateReqInput: " + err.Error(), ""
	}
	req.stream = b.Stream != nil && *b.Stream
	switch {
	case isNull(b.Text) && isNull(b.InputIDs) && isNull(b.InputEmbeds):
		return req, "", "Either text, input_ids or input_embeds should be provided."
	case !isNull(b.InputIDs):
		var single []int64
		if err := json.Unmarshal(b.InputIDs, &single); err != nil {
			var batch [][]int64
			if json.Unmarshal(b.InputIDs, &batch) == nil {
				return req, "", "the mock worker serves one prompt a request: input_ids must be a list of ints, not a batch"
			}
			return req, "input_ids: must be a list of ints or a list of lists of ints", ""
		}
		if len(single) == 0 {
			return req, "", "input_ids cannot be empty."
		}
		for _, id := range single {
			if id < 0 || id > 1<<32-1 {
				return req, "", sglangValueError(fmt.Sprintf("input_ids: token id %d is out of the vocabulary", id))
			}
		}
		req.ids = single
	case !isNull(b.Text):
		var s string
		if err := json.Unmarshal(b.Text, &s); err != nil {
			var batch []string
			if json.Unmarshal(b.Text, &batch) == nil {
				return req, "", "the mock worker serves one prompt a request: text must be a string, not a batch"
			}
			return req, "text: must be a string or a list of strings", ""
		}
		if s == "" {
			return req, "", "texts cannot be empty and tokenizer must be initialized"
		}
		req.text = &s
	default:
		return req, "", "input_embeds is provided while disable_radix_cache is False. Please add `--disable-radix-cache` when you launch the server if you want to use input_embeds as inputs."
	}
	for _, mm := range []json.RawMessage{b.ImageData, b.VideoData, b.AudioData} {
		if !isNull(mm) && string(mm) != "[]" {
			return req, "", "the mock worker serves no multimodal input: image_data, video_data and audio_data must be null"
		}
	}
	var sp struct {
		MaxNewTokens json.RawMessage `json:"max_new_tokens"`
		N            *int            `json:"n"`
	}
	if !isNull(b.SamplingParams) {
		if err := json.Unmarshal(b.SamplingParams, &sp); err != nil {
			if b.SamplingParams[0] == '[' {
				return req, "", "the mock worker serves one prompt a request: sampling_params must be an object, not a list"
			}
			return req, "sampling_params: " + err.Error(), ""
		}
	}
	if sp.N != nil && *sp.N > 1 {
		return req, "", sglangValueError(fmt.Sprintf("the mock worker generates one sequence a request: sampling_params.n must be 1, got %d", *sp.N))
	}
	// Absent, the bound is SGLang's default, which _validate_one_request does not check
	// against the context (it reads the body's max_new_tokens): the scheduler trims it.
	n := sglangDefaultMaxNewTokens
	req.maxNewTokens, req.defaultBound = &n, len(sp.MaxNewTokens) == 0
	if string(sp.MaxNewTokens) == "null" {
		req.maxNewTokens = nil
	} else if len(sp.MaxNewTokens) > 0 {
		if err := json.Unmarshal(sp.MaxNewTokens, &n); err != nil {
			return req, "", sglangValueError("sampling_params.max_new_tokens must be an integer: " + err.Error())
		}
		switch {
		case n < 0:
			return req, "", sglangValueError(fmt.Sprintf("max_new_tokens must be at least 0, got %d.", n))
		case n == 0:
			return req, "", "the mock worker cannot prefill only: sampling_params.max_new_tokens must be at least 1"
		}
	}
	var ok bool
	if req.rid, ok = sglangString(b.RID); !ok {
		if b.RID[0] == '[' {
			return req, "", "the mock worker serves one prompt a request: rid must be a string"
		}
		return req, "", "The rid should be a string or a list of strings."
	}
	if req.lora, ok = sglangString(b.LoRAPath); !ok {
		return req, "", "the mock worker serves one prompt a request: lora_path must be a string"
	}
	if req.cacheSalt, ok = sglangString(b.CacheSalt); !ok {
		return req, "", "cache_salt should be a string for a single request."
	}
	if req.session, validation = parseSGLangSessionParams(b.SessionParams); validation != "" {
		return req, validation, ""
	}
	if !isNull(b.SessionID) && !isNull(b.SessionParams) {
		return req, "", "session_id and session_params cannot both be set."
	}
	return req, "", ""
}

// serveSGLangGenerate serves POST /generate as SGLang's generate_request does. Errors
// SGLang raises as ValueError while it serves the request answer 400 {"error":
// {"message"}}, or, streamed, a data: {"error": …} event after a 200 and data: [DONE].
// The output is bounded by sampling_params.max_new_tokens (128 unless given, trimmed to
// the context; null: the context), and a prompt or a given bound past the context
// (MaxModelLen) is refused in _validate_one_request's words.
func (s *Server) serveSGLangGenerate(w http.ResponseWriter, r *http.Request) {
	// Its refusals (an unknown session's among them) name the worker too.
	w.Header().Set("x-served-by", s.cfg.Name)
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeSGLangValidationError(w, "cannot read the body")
		return
	}
	req, validation, valueErr := parseSGLang(body)
	if validation != "" {
		writeSGLangValidationError(w, validation)
		return
	}
	fail := func(msg string) {
		if !req.stream {
			writeSGLangError(w, msg)
			return
		}
		w.Header().Set("content-type", "text/event-stream; charset=utf-8")
		writeSSE(w, sglangError(msg))
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
	if valueErr != "" {
		fail(string(valueErr))
		return
	}
	// SGLang serves one model, named by no request: its tokenizer is the first served
	// model's (the base model's, for an adapter).
	model := "mock"
	if len(s.cfg.ServedModels) > 0 {
		model = s.cfg.ServedModels[0]
	}
	if req.lora != "" {
		base, ok := s.cfg.LoRAAdapters[req.lora]
		switch {
		case len(s.cfg.LoRAAdapters) == 0:
			fail(fmt.Sprintf("LoRA adapter '%s' was requested, but LoRA is not enabled. Please launch the server with --enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint.", req.lora))
			return
		case !ok:
			// SGLang lists them in load order; a map has none, so sorted, the same each time.
			names := slices.Sorted(maps.Keys(s.cfg.LoRAAdapters))
			for i, name := range names {
				names[i] = "'" + name + "'"
			}
			fail(fmt.Sprintf("Got LoRA adapter that has never been loaded: %s\nAll loaded adapters: dict_keys([%s]).", req.lora, strings.Join(names, ", ")))
			return
		}
		model = base
	}
	encoder := s.tokenizers.Model(model)
	var prompt []uint32
	if req.ids != nil {
		prompt = tokenIDs(req.ids)
	} else {
		enc, err := encoder.EncodePrompt(r.Context(), tokenize.Prompt{Text: *req.text})
		if err != nil || len(enc.IDs) == 0 {
			fail(fmt.Sprint("bad prompt: ", err))
			return
		}
		prompt = enc.IDs
	}
	// _validate_one_request's checks (no reserved tokens).
	if len(prompt) >= s.cfg.MaxModelLen {
		fail(fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", len(prompt), s.cfg.MaxModelLen))
		return
	}
	maxTokens := s.cfg.MaxModelLen - len(prompt)
	if n := req.maxNewTokens; n != nil && req.defaultBound {
		maxTokens = min(maxTokens, *n)
	} else if n != nil {
		if *n+len(prompt) > s.cfg.MaxModelLen {
			fail(fmt.Sprintf("Requested token count exceeds the model's maximum context length of %d tokens. You requested a total of %d tokens: %d tokens from the input messages and %d tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
				s.cfg.MaxModelLen, *n+len(prompt), len(prompt), *n))
			return
		}
		maxTokens = *n
	}
	rid := req.rid
	if rid == "" {
		rid = s.sglangUUID()
	}
	start := time.Now()
	// The scheduler rebuilds a session's prompt from its history, then checks its
	// length (validate_input_length, in its words as recalled, not read) and trims the
	// output bound to the context.
	var bos uint32
	var hasBOS bool
	if req.session != nil && req.session.ID != nil {
		bos, hasBOS = bosOf(r, encoder)
	}
	turn, prompt, abort := s.sessions.begin(req.session, rid, prompt, bos, hasBOS)
	if abort == "" && len(prompt) >= s.cfg.MaxModelLen {
		abort = fmt.Sprintf("Input length (%d tokens) exceeds the maximum allowed length (%d tokens). Use a shorter input or enable --allow-auto-truncate.", len(prompt), s.cfg.MaxModelLen-1)
		s.sessions.end(turn, nil, false)
	}
	if abort != "" {
		writeSGLangAbort(w, req.stream, rid, len(prompt), start, abort)
		return
	}
	maxTokens = min(maxTokens, s.cfg.MaxModelLen-len(prompt))
	completed, generated := false, 0
	var output []uint32
	defer func() { s.sessions.end(turn, output[:min(generated, len(output))], completed) }()
	g, ok := s.begin(w, r, body, "", work{encoder: encoder, prompt: prompt, maxTokens: maxTokens, lora: req.lora, cacheSalt: req.cacheSalt}, nil)
	if !ok {
		return
	}
	sr := g.sr
	output = sr.Output
	// meta_info as _handle_batch_output builds it for a text request without metrics,
	// logprobs or speculative decoding; finished, it gains the finish reason and
	// e2e_latency. The first answer sent also gets response_sent_to_client_ts.
	metaInfo := func(generated int, finished, first bool) map[string]any {
		m := map[string]any{"id": rid, "finish_reason": nil, "prompt_tokens": len(sr.Prompt), "weight_version": "default",
			"num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": generated, "cached_tokens": cachedTokens(sr)}
		if finished {
			m["finish_reason"] = map[string]any{"type": "length", "length": len(sr.Output)}
			m["e2e_latency"] = time.Since(start).Seconds()
		}
		if first {
			m["response_sent_to_client_ts"] = float64(time.Now().UnixNano()) / 1e9
		}
		return m
	}
	answer := func(to int, finished, first bool) []byte {
		b, _ := json.Marshal(map[string]any{"text": strings.Join(g.words[:to], ""), "output_ids": sr.Output[:to], "meta_info": metaInfo(to, finished, first)})
		return b
	}
	var emit func(int, int, bool)
	if req.stream {
		w.Header().Set("content-type", "text/event-stream; charset=utf-8")
		emit = func(from, to int, finished bool) { writeSSE(w, answer(to, finished, from == 0)) }
	}
	sent, end := s.generate(w, r, g.rk, sr, g.ch, emit)
	generated, completed = sent, end == generateFinished
	switch end {
	case generateGone:
		return
	case generateStopped:
		if !req.stream && sent == 0 {
			writeSGLangError(w, "worker stopped")
		}
		return
	}
	s.finished(g)
	if req.stream {
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("content-type", "application/json")
	_, _ = w.Write(answer(len(sr.Output), true, true))
}
