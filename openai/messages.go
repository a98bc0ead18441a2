package openai

import (
	"github.com/kvroute/kvroute/jsonv"
)

// MessagesRequest is what routing reads of an Anthropic Messages API request body
// (POST /v1/messages), which vLLM serves by converting it into a chat completion
// (MessagesChat).
type MessagesRequest struct {
	Model  string
	Stream bool
	// CacheSalt is the request's cache_salt (a vLLM extension of the Messages API): vLLM
	// passes it on to the chat completion it builds, so the prompt's blocks live in
	// their own namespace, as a chat request's. "" when absent or null.
	CacheSalt string
	// MaxTokens is the request's max_tokens, which vLLM passes on as the chat's
	// max_tokens and max_completion_tokens: the router's context check needs it as it
	// needs a chat's ([Request.MaxTokens]). 0 when absent or null (the engine refuses
	// such a body: the field is required there).
	MaxTokens int64
}

// ParseMessages reads a /v1/messages body's routing fields. The body must be a JSON
// object whose model is a non-empty string; stream is a boolean as the engines read
// it (see laxBool) or null; cache_salt a string or null; max_tokens a non-negative
// integer (pydantic's lax int) or null. Other fields (messages, system, tools…) are
// syntax-checked and skipped, never materialised, so the parse allocates no more than
// the scalars' texts whatever the body holds. Every rejection is a *FieldError, with
// the messages of [Parse] for the body as a whole and for the model. For a field given
// twice, the last one counts, as in Parse (and the engines' Python JSON parsing).
func ParseMessages(body []byte, lim Limits) (MessagesRequest, error) {
	return parseRoutingFields(body, lim, &messagesFields{})
}

// messagesFields are the routing fields of a Messages API body as read, kept and
// judged once the body is read so that a later duplicate overrides an earlier one.
// ParseMessages and MessagesChat share them, so that a body gets one error from both.
type messagesFields struct {
	model, stream, salt, maxTokens jsonv.Value
}

// read reads key's value when key is one of the fields, and reports whether it was.
func (f *messagesFields) read(dec *jsonv.Decoder, key string) (bool, error) {
	var err error
	switch key {
	case "model":
		f.model, err = scalarField(dec)
	case "stream":
		f.stream, err = scalarField(dec)
	case "cache_salt":
		f.salt, err = scalarField(dec)
	case "max_tokens":
		f.maxTokens, err = scalarField(dec)
	default:
		return false, nil
	}
	return true, err
}

// judge checks the fields read, in a fixed order, and returns them.
func (f *messagesFields) judge() (MessagesRequest, error) {
	var out MessagesRequest
	var err error
	if out.Model, err = modelOf(f.model); err != nil {
		return MessagesRequest{}, err
	}
	if out.Stream, err = optionalBool(f.stream, "stream", false); err != nil {
		return MessagesRequest{}, err
	}
	if out.CacheSalt, err = cacheSaltOf(f.salt); err != nil {
		return MessagesRequest{}, err
	}
	if !f.maxTokens.IsNull() {
		n, ok := laxInt(f.maxTokens)
		if !ok || n < 0 {
			return MessagesRequest{}, badField("max_tokens", "'max_tokens' must be a non-negative integer")
		}
		out.MaxTokens = n
	}
	return out, nil
}
