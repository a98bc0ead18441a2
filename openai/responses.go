package openai

import (
	"github.com/kvroute/kvroute/jsonv"
)

// MaxResponseIDBytes is the longest Responses API response id kvroute reads, in bytes
// of its text (after JSON unescaping). Engines' ids are short (vLLM's are "resp_" and a
// UUID, OpenAI's about 50 bytes); the bound keeps a hostile body or response from
// making kvroute keep, key a map by, or log an id of arbitrary size.
const MaxResponseIDBytes = 512

// ResponsesRequest is what routing reads of a Responses API request body
// (POST /v1/responses).
type ResponsesRequest struct {
	Model string
	// PreviousResponseID is the response the request continues: only the worker that
	// stored that response can serve it (others answer 404). "" when absent or null.
	PreviousResponseID string
	// Store is the body's store: whether the engine keeps the response, so that a
	// follow-up naming it must come back to the same worker. True when absent or null,
	// OpenAI's and vLLM's default. (vLLM takes an explicit null as not storing; reading
	// it as true only makes kvroute learn an id that nobody can name successfully.)
	Store bool
	// Background is the body's background: the engine answers at once and serves the
	// response later (vLLM requires store for it).
	Background bool
	Stream     bool
	// CacheSalt is the request's cache_salt (vLLM): its blocks live in their own
	// namespace, as a chat request's.
	CacheSalt string
}

// ParseResponses reads a /v1/responses body's routing fields. The body must be a JSON
// object whose model is a non-empty string; previous_response_id is a string or null
// (an empty one, or one over [MaxResponseIDBytes] bytes, is read as absent); store, background and stream are booleans as
// the engines read them (1, "yes" and the like, see laxBool), or null. Other fields
// (input, instructions, tools…) are syntax-checked and skipped, never materialised, so
// the parse allocates no more than the scalars' texts whatever the body holds. Every
// rejection is a *FieldError, with the messages of [Parse] for the body as a whole and
// for the model. For a field given twice, the last one counts, as in [Parse] (and the
// engines' Python JSON parsing).
func ParseResponses(body []byte, lim Limits) (ResponsesRequest, error) {
	return parseRoutingFields(body, lim, &responsesFields{})
}

// routingFields reads a body's routing fields member by member (read reports whether
// it took the member) and judges them once the body is read (judge), so that a later
// duplicate overrides an earlier one.
type routingFields[R any] interface {
	read(dec *jsonv.Decoder, key string) (bool, error)
	judge() (R, error)
}

// parseRoutingFields reads body's routing fields into fields and judges them: the
// other members are syntax-checked and skipped, never materialised, so the parse
// allocates no more than the scalars' texts whatever the body holds. Every rejection
// is a *FieldError.
func parseRoutingFields[R any](body []byte, lim Limits, fields routingFields[R]) (R, error) {
	var zero R
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return zero, err
	}
	// No routing field takes an array or an object: with a budget of 0, scalarField
	// skips one such (reading it as an empty array, which gets the field's error)
	// instead of materialising it.
	dec.SetValueBudget(0)
	err = readObject(dec, lim, func(key string) error {
		if read, err := fields.read(dec, key); read {
			return err
		}
		return dec.Skip()
	})
	if err != nil {
		return zero, err
	}
	return fields.judge()
}

// responsesFields are the routing fields of a Responses API body as read. As in Parse,
// values are kept and judged once the body is read, so that a later duplicate overrides
// an earlier one before anything is judged. ParseResponses and ResponsesChat share them,
// so that a body gets one error from both.
type responsesFields struct {
	model, previous, store, background, stream, salt jsonv.Value
}

// read reads key's value when key is one of the fields, and reports whether it was.
func (f *responsesFields) read(dec *jsonv.Decoder, key string) (bool, error) {
	var err error
	switch key {
	case "model":
		f.model, err = scalarField(dec)
	case "previous_response_id":
		f.previous, err = scalarField(dec)
	case "store":
		f.store, err = scalarField(dec)
	case "background":
		f.background, err = scalarField(dec)
	case "stream":
		f.stream, err = scalarField(dec)
	case "cache_salt":
		f.salt, err = scalarField(dec)
	default:
		return false, nil
	}
	return true, err
}

// judge checks the fields read, in a fixed order, and returns them.
func (f *responsesFields) judge() (ResponsesRequest, error) {
	var out ResponsesRequest
	var err error
	if out.Model, err = modelOf(f.model); err != nil {
		return ResponsesRequest{}, err
	}
	if out.PreviousResponseID, err = previousResponseID(f.previous); err != nil {
		return ResponsesRequest{}, err
	}
	if out.Store, err = optionalBool(f.store, "store", true); err != nil {
		return ResponsesRequest{}, err
	}
	if out.Background, err = optionalBool(f.background, "background", false); err != nil {
		return ResponsesRequest{}, err
	}
	if out.Stream, err = optionalBool(f.stream, "stream", false); err != nil {
		return ResponsesRequest{}, err
	}
	if out.CacheSalt, err = cacheSaltOf(f.salt); err != nil {
		return ResponsesRequest{}, err
	}
	return out, nil
}

// previousResponseID reads the previous_response_id field's value: a string, or null
// (""). An empty id, or one over MaxResponseIDBytes, reads as "" (no response kvroute
// could have remembered): a client may choose its responses' ids (vLLM takes the
// request's request_id as the response's), and the engine, not kvroute, judges them.
// (The decoder has already checked the text is valid UTF-8.)
func previousResponseID(v jsonv.Value) (string, error) {
	switch {
	case v.IsNull():
		return "", nil
	case v.Kind() != jsonv.String:
		return "", badField("previous_response_id", "'previous_response_id' must be a string or null")
	case len(v.Str()) > MaxResponseIDBytes:
		return "", nil
	}
	return v.Str(), nil
}
