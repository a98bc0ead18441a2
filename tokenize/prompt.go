package tokenize

import (
	"context"
	"errors"
	"fmt"
)

// Errors a [PromptEncoder] wraps so its callers can tell a client's mistake from a
// prompt that only this encoder cannot compute.
var (
	// ErrRefused is wrapped by the error of a chat the model's template refused (a
	// raise_exception: roles that do not alternate, a tool message with no call). The
	// engine refuses the same request with 400, and so should the caller.
	ErrRefused = errors.New("tokenize: the chat template refused the chat")
	// ErrUnsupported is wrapped by the error of a prompt this encoder cannot reproduce
	// although the engine may accept it (media content parts): route such a request
	// without its prompt, never fail it.
	ErrUnsupported = errors.New("tokenize: prompt not supported by this encoder")
	// ErrEngine is wrapped by the error of an encoder that asks the engine and did not
	// get an answer it can use (down, slow, busy, an error status, a malformed reply).
	ErrEngine = errors.New("tokenize: the engine's render endpoint failed")
)

// Prompt is a request's prompt as the router holds it: a chat (Chat set) or a
// completions text (Text). Body is the request body it was read from, for encoders
// that hand the whole request to the engine; it may be nil for the others.
type Prompt struct {
	Chat *Chat
	Text string
	Body []byte
}

// PromptEncoder turns a request's prompt into the token ids the model's engine
// computes for it: a chat is rendered with the model's template and encoded without
// special tokens (the template writes them), a completions text is encoded with them.
// It returns the prompt text as well when it has it ("" for an encoder that asks the
// engine, which returns ids only). Implementations are safe for concurrent use; the
// returned ids belong to the caller.
type PromptEncoder interface {
	EncodePrompt(ctx context.Context, p Prompt) (text string, ids []uint32, err error)
}

// Pipeline is the in-process [PromptEncoder]: a chat renderer and a tokenizer. The
// zero value is not usable; Tokenizer is required, and without Renderer a chat is an
// error.
type Pipeline struct {
	Tokenizer Tokenizer
	Renderer  ChatRenderer
}

var _ PromptEncoder = Pipeline{}

// EncodePrompt implements [PromptEncoder]. Render errors keep their class
// ([ErrRefused], [ErrUnsupported]) for the caller to map.
func (p Pipeline) EncodePrompt(_ context.Context, prompt Prompt) (string, []uint32, error) {
	if prompt.Chat == nil {
		ids, err := p.Tokenizer.Encode(prompt.Text, true)
		if err != nil {
			return "", nil, fmt.Errorf("tokenize: encode: %w", err)
		}
		return prompt.Text, ids, nil
	}
	if p.Renderer == nil {
		return "", nil, errors.New("tokenize: no chat template loaded for this model")
	}
	text, err := p.Renderer.Render(prompt.Chat)
	if err != nil {
		return "", nil, fmt.Errorf("tokenize: render: %w", err)
	}
	ids, err := p.Tokenizer.Encode(text, false)
	if err != nil {
		return "", nil, fmt.Errorf("tokenize: encode: %w", err)
	}
	return text, ids, nil
}
