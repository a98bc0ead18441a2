package openai

import (
	"fmt"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// Generate is vLLM's token-in/token-out API (POST /inference/v1/generate, vLLM's
// serve/disagg GenerateRequest), which RL rollout frameworks call turn after turn of an
// agent's episode: its prompt is token ids, so its blocks are the engine's exactly,
// without a tokenizer. Parse reads it (ParseGenerate).
const Generate = tokenize.APIGenerate

// errGenerateFeatures is the Request.Unsupported of a generate body carrying multimodal
// features: the engine's blocks of such a prompt are keyed by the items' hashes too,
// which token ids alone do not give.
var errGenerateFeatures = fmt.Errorf("%w: the generate request carries multimodal features, whose hashes key its blocks", tokenize.ErrUnsupported)

// ParseGenerate reads a body of vLLM's generate API into the Request a completions
// prompt of token ids gives, as vLLM serves one (ServingTokens.serve_tokens runs it
// through the completions preprocessing):
//   - token_ids (required) is the prompt, read as a completions prompt's ids are;
//   - sampling_params (required, an object): its max_tokens is checked (a non-negative
//     integer or null) but not returned in MaxTokens: vLLM's generate does not refuse
//     an output bound its context cannot hold beside the prompt (build_tok_params:
//     max_output_tokens 0), it stops the request at max_model_len, so only the
//     prompt's fit may leave an engine out;
//   - model is optional: absent, null or "" is the engine's served model, "" here, for
//     the caller to route by load (a generate body need not name the model);
//   - cache_salt has no minimum length here: "" is no salt, as the engine's hashing
//     reads it (a chat's or completions' "" is refused);
//   - features (multimodal items) other than null make the prompt Unsupported.
//
// Other fields (request_id, priority, stream_options, kv_transfer_params) are skipped;
// their syntax is checked. For a field given twice the last counts, as in Parse.
func ParseGenerate(body []byte, lim Limits) (Request, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return Request{}, err
	}
	dec.SetValueBudget(valueBytesPerBodyByte*len(body) + valueBytesFloor)
	var model, stream, salt, features jsonv.Value
	var ids promptField
	var sampling samplingField
	err = readObject(dec, lim, func(key string) error {
		var err error
		switch key {
		case "model":
			model, err = scalarField(dec)
		case "stream":
			stream, err = scalarField(dec)
		case "cache_salt":
			salt, err = scalarField(dec)
		case "token_ids":
			ids, err = readTokenIDs(dec, lim)
		case "sampling_params":
			sampling, err = readSamplingParams(dec)
		case "features":
			features, err = scalarField(dec)
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return Request{}, err
	}

	var out Request
	if out.Model, err = generateModelOf(model); err != nil {
		return Request{}, err
	}
	if out.Stream, err = optionalBool(stream, "stream", false); err != nil {
		return Request{}, err
	}
	switch {
	case salt.IsNull():
	case salt.Kind() != jsonv.String:
		return Request{}, badField("cache_salt", "'cache_salt' must be a string")
	default:
		out.CacheSalt = salt.Str()
	}
	switch {
	case !ids.seen:
		return Request{}, badField("token_ids", "'token_ids' is required: an array of token ids")
	case ids.err != nil:
		return Request{}, ids.err
	case !sampling.seen:
		return Request{}, badField("sampling_params", "'sampling_params' is required: an object")
	case sampling.err != nil:
		return Request{}, sampling.err
	}
	out.Tokens, out.Sequences = ids.ids, sequencesOf(sampling.samples, 1)
	if !features.IsNull() {
		out.Unsupported = errGenerateFeatures
	}
	return out, nil
}

// readTokenIDs reads a generate body's token_ids (list[int]): an array of ids read as
// pydantic's lax int reads them (laxTokenID), at most lim.MaxPromptTokens. A fault of
// the value is the field's, judged once the body is read; the error returned is the
// body's syntax.
func readTokenIDs(dec *jsonv.Decoder, lim Limits) (promptField, error) {
	p := promptField{seen: true}
	if k, err := dec.Peek(); err != nil {
		return p, err
	} else if k != jsonv.Array {
		p.err = badField("token_ids", "'token_ids' must be an array of token ids")
		return p, dec.Skip()
	}
	return p, p.idsField(dec, lim, "token_ids")
}

// samplingField is a generate body's sampling_params as far as routing checks it.
type samplingField struct {
	seen    bool
	samples jsonv.Value // n, the parallel samples
	err     error       // the value's fault, judged once the body is read
}

// readSamplingParams reads a generate body's sampling_params: an object whose
// max_tokens (the last one given) must be a non-negative integer or null, and whose n
// is the parallel samples; its other members are skipped.
func readSamplingParams(dec *jsonv.Decoder) (samplingField, error) {
	f := samplingField{seen: true}
	if k, err := dec.Peek(); err != nil {
		return f, err
	} else if k != jsonv.Object {
		f.err = badField("sampling_params", "'sampling_params' must be an object")
		return f, dec.Skip()
	}
	var maxTokens jsonv.Value
	err := dec.Members(func(key string) error {
		var err error
		switch key {
		case "max_tokens":
			maxTokens, err = scalarField(dec)
		case "n":
			f.samples, err = scalarField(dec)
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return f, err
	}
	if !maxTokens.IsNull() {
		if n, ok := laxInt(maxTokens); !ok || n < 0 {
			f.err = badField("sampling_params.max_tokens", "'sampling_params.max_tokens' must be a non-negative integer")
		}
	}
	return f, nil
}

// generateModelOf reads a generate body's model (str | None): absent or null is "".
func generateModelOf(model jsonv.Value) (string, error) {
	switch {
	case model.IsNull():
		return "", nil
	case model.Kind() != jsonv.String:
		return "", badField("model", "'model' must be a string")
	}
	return model.Str(), nil
}
