package openai

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// SGLangGenerate is SGLang's native generate API (POST /generate, its
// GenerateReqInput), which RL frameworks and SGLang's own router call: the prompt is
// text, encoded as a completions prompt is, or token ids. Parse reads it
// (ParseSGLangGenerate).
const SGLangGenerate = tokenize.APISGLang

// errSGLangUnread wraps the Request.Unsupported of an SGLang body whose prompt kvroute
// does not compute: it is routed by load and the engine judges it.
var errSGLangUnread = fmt.Errorf("%w: SGLang generate body", tokenize.ErrUnsupported)

// sglangUnread is the Request.Unsupported saying why an SGLang body is routed by load.
func sglangUnread(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errSGLangUnread, fmt.Sprintf(format, args...))
}

// ParseSGLangGenerate reads a body of SGLang's POST /generate (io_struct.py's
// GenerateReqInput, normalize_batch_and_arguments, tokenizer_manager.py) into the
// Request its prompt gives:
//   - input_ids (a list of ids, or a batch of them: the first) win over text, as in
//     _tokenize_one_request; text (a string, or a batch: the first) is a completions
//     prompt, encoded with the tokenizer's special tokens and no chat template;
//   - sampling_params (an object, or a batch's list: the first) gives max_new_tokens,
//     the output bound SGLang checks beside the prompt against the context
//     (_validate_one_request reads the body's sampling_params.get("max_new_tokens")):
//     absent or null is 0, no bound checked (the scheduler trims the default 128 to the
//     context);
//   - cache_salt and extra_key, SGLang's cache namespaces, salt the blocks (a batch's
//     lists: the first); lora_path (a string, or a batch's list: the first) names the
//     request's adapter (Request.LoRA);
//   - session_params.id names the SGLang session the turn continues
//     (Request.SGLangSession): its engine builds the prompt from the session's history,
//     so the body's text or ids are not the prompt, and the request is Unsupported
//     (routed by load, to the session's engine); session_id, SGLang's newer identity
//     of a session that leaves the prompt as it is, is Request.SessionKey;
//   - there is no model: Model is "", for the caller to give (the model header, its
//     default model).
//
// The engine is the judge of a body SGLang may refuse or serve otherwise: input_embeds
// without text or input_ids, multimodal data (has_valid_data's: not lists of nulls alone),
// no prompt, or a field of a type this reading does not take make the
// request Unsupported (routed by load), never the client's 400. Only a body that is not
// a JSON object, or is nested past the limit, is refused (a *FieldError).
func ParseSGLangGenerate(body []byte, lim Limits) (Request, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return Request{}, err
	}
	dec.SetValueBudget(valueBytesPerBodyByte*len(body) + valueBytesFloor)
	var text, stream, salt, extraKey, lora jsonv.Value
	var ids promptField
	var sampling, session, sessionKey jsonv.Value
	var unread error // the last field that makes the prompt one kvroute does not compute
	var embeds bool  // input_embeds were given
	err = readObject(dec, lim, func(key string) error {
		var err error
		switch key {
		case "text":
			text, err = scalarField(dec)
		case "input_ids":
			ids, err = readSGLangIDs(dec, lim)
		case "sampling_params":
			sampling, err = scalarField(dec)
		case "stream":
			stream, err = scalarField(dec)
		case "cache_salt":
			salt, err = scalarField(dec)
		case "extra_key":
			extraKey, err = scalarField(dec)
		case "lora_path":
			lora, err = scalarField(dec)
		case "session_params":
			session, err = scalarField(dec)
		case "session_id":
			sessionKey, err = scalarField(dec)
		case "input_embeds":
			// _determine_batch_size drops them beside text or input_ids.
			var has bool
			if has, err = sglangHasData(dec); has {
				embeds = true
			}
		case "image_data", "video_data", "audio_data":
			var has bool
			if has, err = sglangHasData(dec); has {
				unread = sglangUnread("its %s are part of the prompt", key)
			}
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return Request{}, err
	}

	var out Request
	out.Stream, _ = laxBool(stream)
	var fault error
	switch {
	case ids.seen && ids.err == nil:
		out.Tokens = ids.ids
	case ids.seen:
		fault = sglangUnread("input_ids: %v", ids.err)
	case firstOf(text).Kind() == jsonv.String:
		out.Prompt = firstOf(text).Str()
	case !text.IsNull():
		fault = sglangUnread("text is neither a string nor a list of them")
	case embeds:
		fault = sglangUnread("its input_embeds are the prompt")
	default:
		fault = sglangUnread("it gives no text or input_ids")
	}
	sampling = firstOf(sampling)
	out.Sequences = sglangSequences(ids, text, sampling)
	out.MaxTokens, err = sglangMaxNewTokens(sampling)
	fault = errors.Join(fault, err)
	var key string
	for _, f := range []struct {
		name string
		v    jsonv.Value
		to   *string
	}{{"cache_salt", salt, &out.CacheSalt}, {"extra_key", extraKey, &key}, {"lora_path", lora, &out.LoRA}} {
		s, err := firstString(f.v, f.name)
		fault = errors.Join(fault, err)
		*f.to = s
	}
	if key != "" {
		// SGLang keys its radix cache by extra_key beside the salt: the pair is the
		// namespace. A salt a client means does not hold the unit separator.
		out.CacheSalt += "\x1fextra_key=" + key
	}
	out.SessionKey = boundedSessionID(sessionKey)
	if out.SGLangSession = boundedSessionID(lastMember(session, "id")); out.SGLangSession != "" {
		// The engine's prompt is the session's history (the previous request's prompt
		// and output, cut at offset) followed by this body's: kvroute knows neither the
		// history nor where it ends.
		unread = errors.Join(unread, sglangUnread("it continues an SGLang session, whose history its engine holds"))
	}
	if fault = errors.Join(unread, fault); fault != nil {
		return Request{Stream: out.Stream, Tokens: []uint32{}, Unsupported: fault, Sequences: out.Sequences, SGLangSession: out.SGLangSession, SessionKey: out.SessionKey}, nil
	}
	return out, nil
}

// sglangHasData reads a field as SGLang's has_valid_data judges it: null, and lists
// (nested or not) holding nothing but null, are no data; any other value is. Nothing is
// materialised: a large field takes no memory.
func sglangHasData(dec *jsonv.Decoder) (bool, error) {
	k, err := dec.Peek()
	switch {
	case err != nil:
		return false, err
	case k == jsonv.Null:
		return false, dec.Skip()
	case k != jsonv.Array:
		return true, dec.Skip()
	}
	has := false
	err = dec.Elements(func(int) error {
		if has {
			return dec.Skip()
		}
		var err error
		has, err = sglangHasData(dec)
		return err
	})
	return has, err
}

// firstOf is a field's value as a single request reads it: a batch's list gives its
// first item (normalize_batch_and_arguments), any other value is itself.
func firstOf(v jsonv.Value) jsonv.Value {
	if v.Kind() == jsonv.Array && v.Len() > 0 {
		return v.Items()[0]
	}
	return v
}

// readSGLangIDs reads input_ids: a list of ids, or a batch of lists (the first is
// kept, the rest syntax-checked), as normalize_batch_and_arguments tells them apart
// (ids[0] an int: one prompt). A fault is the field's, which routes the request by load.
func readSGLangIDs(dec *jsonv.Decoder, lim Limits) (promptField, error) {
	p := promptField{seen: true}
	k, err := dec.Peek()
	switch {
	case err != nil:
		return p, err
	case k == jsonv.Null:
		return promptField{}, dec.Skip()
	case k != jsonv.Array:
		p.err = badField("input_ids", "'input_ids' must be a list of token ids or of lists of them")
		return p, dec.Skip()
	}
	first, empty, err := dec.PeekFirst()
	switch {
	case err != nil:
		return p, err
	case empty:
		p.err = badField("input_ids", "input_ids cannot be empty")
		return p, dec.Skip()
	case first != jsonv.Array:
		return p, p.idsField(dec, lim, "input_ids")
	}
	err = dec.Elements(func(i int) error {
		p.count = i + 1
		if i > 0 {
			return dec.Skip()
		}
		return p.idsField(dec, lim, "input_ids")
	})
	return p, err
}

// sglangMaxNewTokens reads the output bound of a request's sampling_params (an object;
// absent or null is SGLang's {}): max_new_tokens, 0 (no bound SGLang checks against
// the context) when absent or null.
func sglangMaxNewTokens(sampling jsonv.Value) (int64, error) {
	switch sampling.Kind() {
	case jsonv.Null:
		return 0, nil
	case jsonv.Object:
	default:
		return 0, sglangUnread("sampling_params is not an object")
	}
	v, ok := sampling.Get("max_new_tokens")
	if !ok || v.IsNull() {
		return 0, nil
	}
	n, ok := laxInt(v)
	if !ok || n < 0 {
		return 0, sglangUnread("sampling_params.max_new_tokens is not a non-negative integer")
	}
	return n, nil
}

// sglangSequences is the requests SGLang runs for a body (normalize_batch_and_arguments):
// each prompt of its batch (input_ids' lists, else text's strings) times the n of
// sampling, the first request's sampling_params.
func sglangSequences(ids promptField, text, sampling jsonv.Value) int {
	prompts := ids.count
	if !ids.seen && text.Kind() == jsonv.Array {
		prompts = text.Len()
	}
	n, _ := sampling.Get("n")
	return sequencesOf(n, prompts)
}

// firstString reads a field that is a string, null, or a batch's list of them (the
// first): "" when absent or null.
func firstString(v jsonv.Value, name string) (string, error) {
	switch v = firstOf(v); v.Kind() {
	case jsonv.Null:
		return "", nil
	case jsonv.String:
		return v.Str(), nil
	}
	return "", sglangUnread("%s is neither a string nor a list of them", name)
}
