package tokenize

import (
	"context"
	"errors"
	"fmt"
	"unsafe"
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
	// BodyAPI is the API Body is written for, which an encoder that asks the engine
	// posts it to the render endpoint of (zero: as Chat says, chat or completions).
	// A Responses or Messages body comes with the Chat kvroute rebuilt from it, which
	// in-process encoders render instead.
	BodyAPI API
	// AddSpecialTokens, when set, is the request's add_special_tokens: whether the
	// tokenizer's special tokens (a BOS) are added to the ids. nil means the default,
	// as in vLLM: added to a completions text, not to a rendered chat (its template
	// writes them), where true adds them once more.
	AddSpecialTokens *bool
	// Buffers, when set, are the caller's to reuse: an encoder may render and encode
	// into them, and the text and ids it returns may then share their memory, valid
	// only until the caller reuses them. An encoder that grows a buffer stores the
	// grown one back in Buffers, so the caller's next call starts from it.
	Buffers *Buffers
}

// Buffers are a caller's reusable buffers for one [PromptEncoder.EncodePrompt] call:
// a router that needs a prompt's ids only long enough to hash them keeps a set per
// decision in flight instead of allocating a prompt and its ids for each.
type Buffers struct {
	Text []byte
	IDs  []uint32
}

// Encoding is a prompt as a [PromptEncoder] encoded it.
type Encoding struct {
	// Text is the prompt text (the rendered chat or the completions text); "" from an
	// encoder that asks the engine, which returns ids only.
	Text string
	// IDs are the prompt's token ids: all of them, or, when Rest is not 0, exactly
	// their first ones. They belong to the caller.
	IDs []uint32
	// Rest is 0 when IDs are the whole prompt's. Otherwise the encoder stopped early, at
	// a bound on its work (max_prompt_tokens, or the tokenizer's own), and Rest is
	// about the bytes of Text it left out (at least 1), from which a caller can
	// estimate the tokens IDs lack.
	Rest int
	// Approximate is set when IDs are not the engine's ids but an estimate of their
	// count ([Approx]): a caller may route on them, but must not take their number for
	// the engine's (an engine's refusal of a prompt past its context, for one).
	Approximate bool
}

// PromptEncoder turns a request's prompt into the token ids the model's engine
// computes for it: a chat is rendered with the model's template and encoded without
// special tokens (the template writes them), a completions text is encoded with them.
// Implementations are safe for concurrent use.
type PromptEncoder interface {
	EncodePrompt(ctx context.Context, p Prompt) (Encoding, error)
}

// Pipeline is the in-process [PromptEncoder]: a chat renderer and a tokenizer. The
// zero value is not usable; Tokenizer is required, and without Renderer a chat is an
// error.
type Pipeline struct {
	Tokenizer Tokenizer
	Renderer  ChatRenderer
	// MaxTokens, when > 0, bounds the ids of one prompt (max_prompt_tokens): a
	// Tokenizer that is a [PrefixEncoder] stops there, or sooner at a bound of its own
	// on the work of one prompt, and the encoding is the prompt's first ids, with its
	// Rest set. Other tokenizers, and a zero MaxTokens, encode prompts whole.
	MaxTokens int
}

var _ PromptEncoder = Pipeline{}

// EncodePrompt implements [PromptEncoder]. Render errors keep their class
// ([ErrRefused], [ErrUnsupported]) for the caller to map; a chat whose ctx ended while
// it was rendered is not encoded, and ctx's error is returned.
func (p Pipeline) EncodePrompt(ctx context.Context, prompt Prompt) (Encoding, error) {
	text, addSpecialTokens := prompt.Text, true
	if prompt.Chat != nil {
		if p.Renderer == nil {
			return Encoding{}, errors.New("tokenize: no chat template loaded for this model")
		}
		var err error
		if text, err = p.render(prompt.Chat, prompt.Buffers); err != nil {
			return Encoding{}, fmt.Errorf("tokenize: render: %w", err)
		}
		addSpecialTokens = false
		// A request its caller gave up on during the render (Envoy's message_timeout)
		// is not encoded: under overload, work for streams already gone is what keeps
		// the backlog growing.
		if err := ctx.Err(); err != nil {
			return Encoding{}, err
		}
	}
	if prompt.AddSpecialTokens != nil {
		addSpecialTokens = *prompt.AddSpecialTokens
	}
	ids, rest, err := p.encode(text, addSpecialTokens, prompt.Buffers)
	if err != nil {
		return Encoding{}, fmt.Errorf("tokenize: encode: %w", err)
	}
	// Approx's ids are no engine's: their count is an estimate of the engine's.
	_, approximate := p.Tokenizer.(Approx)
	return Encoding{Text: text, IDs: ids, Rest: rest, Approximate: approximate}, nil
}

// render renders a chat, into buf.Text when there are buffers and the renderer can
// append (the text then shares buf.Text's memory).
func (p Pipeline) render(chat *Chat, buf *Buffers) (string, error) {
	r, ok := p.Renderer.(AppendRenderer)
	if buf == nil || !ok {
		return p.Renderer.Render(chat)
	}
	out, err := r.AppendRender(buf.Text[:0], chat)
	if err != nil {
		return "", err
	}
	buf.Text = out
	return unsafe.String(unsafe.SliceData(out), len(out)), nil
}

// encode encodes text, into buf.IDs when there are buffers and the tokenizer can
// append, within MaxTokens when the tokenizer can stop early.
func (p Pipeline) encode(text string, addSpecialTokens bool, buf *Buffers) ([]uint32, int, error) {
	var dst []uint32
	if buf != nil {
		dst = buf.IDs[:0]
	}
	var ids []uint32
	var rest int
	var err error
	prefix, canStop := p.Tokenizer.(PrefixEncoder)
	appender, canAppend := p.Tokenizer.(AppendEncoder)
	switch {
	case canStop && p.MaxTokens > 0:
		ids, rest, err = prefix.AppendEncodePrefix(dst, text, addSpecialTokens, p.MaxTokens)
	case canAppend && buf != nil:
		ids, err = appender.AppendEncode(dst, text, addSpecialTokens)
	default:
		ids, err = p.Tokenizer.Encode(text, addSpecialTokens)
		return ids, 0, err
	}
	if err != nil {
		return nil, 0, err
	}
	if buf != nil {
		buf.IDs = ids
	}
	return ids, rest, nil
}
