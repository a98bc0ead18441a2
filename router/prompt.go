package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/tokenize"
)

// Reasons a request was routed by load because its prompt could not be encoded: the
// reason label of kvroute_router_prompt_fallbacks_total and Decision.PromptFallback.
const (
	// FallbackUnsupported: content the renderer does not reproduce (media parts, a
	// chat naming its own chat_template, a completions request's prompt_embeds or
	// suffix: Request.Unsupported), or a prompt the engine truncates
	// (truncate_prompt_tokens).
	FallbackUnsupported = "unsupported_content"
	// FallbackEngine: the model's engine render endpoint failed (down, slow, busy, an
	// error status or a malformed reply).
	FallbackEngine = "engine"
	// FallbackError: the renderer or the tokenizer failed otherwise (a template error
	// other than a refusal, a prompt over the renderer's size limit, a render past its
	// time budget).
	FallbackError = "error"
)

// OneTokenizer gives every model the same prompt encoder.
func OneTokenizer(e tokenize.PromptEncoder) Tokenizers { return oneTokenizer{e} }

type oneTokenizer struct{ e tokenize.PromptEncoder }

func (o oneTokenizer) Model(string) tokenize.PromptEncoder { return o.e }

// Prompter computes what a decision knows of a request's prompt before it looks at any
// worker: its token ids (the model's encoder's) and its block hashes. [Router.Route]
// uses it, and so does `extproc tokenize`, which prints what the router sees.
type Prompter struct {
	// BlockSize is the engines' KV block size in tokens.
	BlockSize int
	// Tokenizers gives each model's prompt encoder.
	Tokenizers Tokenizers
	// Metrics is where Router.Route counts the prompts of its decisions (fallbacks,
	// cuts, contexts passed); nil counts nothing. Prompt counts none: a prompt is
	// counted with the decision routing it, once, not at each routing tried (a request
	// refused for capacity, which flow control tries again and again).
	Metrics *Metrics
}

// Prompt is a request's prompt as a decision sees it.
type Prompt struct {
	// Text is the rendered chat or the completions text; "" for a prompt given as token
	// ids or rendered by the engine (which returns ids only).
	Text string
	// Tokens are the prompt's token ids, or, when EstimatedTokens is not 0, exactly
	// its first ones; empty when Fallback is set.
	Tokens []uint32
	// EstimatedTokens, when not 0, is the tokens of the part of the prompt the encoder
	// did not reach (it stopped at max_prompt_tokens ids, or at the tokenizer's bound
	// on long words), estimated from its bytes (estimateTokens). The decision routes on
	// the full blocks of Tokens, and prices the prefill of Tokens and the estimate.
	EstimatedTokens int
	// Approximate is set when Tokens are not the engine's ids but an estimate of their
	// count (tokenize.Approx): routed on, never taken for the engine's length.
	Approximate bool
	// Blocks are the chained hashes of the full blocks of Tokens (DESIGN §4).
	Blocks []uint64
	// Fallback, when set, is why the prompt could not be encoded (a Fallback* reason):
	// the request is then routed by load alone. FallbackErr is the encoder's error.
	Fallback    string
	FallbackErr error
}

// Prompt encodes the request's prompt and hashes its blocks. The errors are a chat the
// model's template refused, or one without messages (wrapping ErrBadRequest), and
// ctx's, when it ends before or while a prompt text is encoded; a prompt that cannot be
// encoded for any other reason comes back empty, with Fallback set.
func (p Prompter) Prompt(ctx context.Context, req *Request) (Prompt, error) {
	prompt, err := p.tokens(ctx, req, nil)
	if err != nil {
		return Prompt{}, err
	}
	prompt.Blocks = p.blocks(req, prompt.Tokens)
	return prompt, nil
}

// tokens fills a Prompt's Text, Tokens and Fallback. With buf, they may share its
// memory (see tokenize.Prompt.Buffers).
func (p Prompter) tokens(ctx context.Context, req *Request, buf *tokenize.Buffers) (Prompt, error) {
	if req.Unsupported != nil {
		return p.fallback(FallbackUnsupported, req.Unsupported), nil
	}
	if req.Tokens != nil {
		if truncated(req, len(req.Tokens), false) {
			return p.fallback(FallbackUnsupported, errTruncated), nil
		}
		return Prompt{Tokens: req.Tokens}, nil
	}
	// A request whose stream is already gone (Envoy's message_timeout passed while it
	// waited for a CPU) is neither rendered nor encoded, and one that went while it
	// was is no fallback: nobody reads its answer.
	if err := ctx.Err(); err != nil {
		return Prompt{}, err
	}
	enc, err := p.Tokenizers.Model(req.Model).EncodePrompt(ctx, tokenize.Prompt{Chat: req.Chat, Text: req.Prompt, Body: req.Body, BodyAPI: req.BodyAPI,
		AddSpecialTokens: req.AddSpecialTokens, Buffers: buf})
	switch {
	case err != nil && ctx.Err() != nil:
		return Prompt{}, ctx.Err()
	case err == nil && truncated(req, len(enc.IDs), enc.Rest > 0):
		return p.fallback(FallbackUnsupported, errTruncated), nil
	case err == nil && enc.Rest > 0:
		return Prompt{Text: enc.Text, Tokens: enc.IDs, EstimatedTokens: estimateTokens(enc.Rest), Approximate: enc.Approximate}, nil
	case err == nil:
		return Prompt{Text: enc.Text, Tokens: enc.IDs, Approximate: enc.Approximate}, nil
	case (errors.Is(err, tokenize.ErrRefused) || errors.Is(err, tokenize.ErrNoMessages)) && req.Rebuilt:
		// The engine may render what kvroute rebuilt otherwise: it judges the request.
		return p.fallback(FallbackUnsupported, err), nil
	case errors.Is(err, tokenize.ErrRefused), errors.Is(err, tokenize.ErrNoMessages):
		return Prompt{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	case errors.Is(err, tokenize.ErrUnsupported):
		return p.fallback(FallbackUnsupported, err), nil
	case errors.Is(err, tokenize.ErrEngine):
		return p.fallback(FallbackEngine, err), nil
	}
	return p.fallback(FallbackError, err), nil
}

// errTruncated is the fallback error of a prompt the engine truncates.
var errTruncated = fmt.Errorf("%w: the request's truncate_prompt_tokens cuts the prompt, on the side the engine's tokenizer chooses", tokenize.ErrUnsupported)

// truncated reports whether the engine cuts a prompt of n tokens to the request's
// truncate_prompt_tokens, or may: a cut encoding (more than n, how many unknown) is
// taken as cut. The limit -1 (max_model_len, unknown here) cuts only prompts the engine
// could not serve whole, so it is taken as no cut.
func truncated(req *Request, n int, more bool) bool {
	return req.TruncatePromptTokens != nil && *req.TruncatePromptTokens >= 0 && (more || int64(n) > *req.TruncatePromptTokens)
}

// truncatesToContext reports whether the request asks the engine to cut its prompt to
// the engine's own context (truncate_prompt_tokens -1).
func truncatesToContext(req *Request) bool {
	return req.TruncatePromptTokens != nil && *req.TruncatePromptTokens == -1
}

// bytesPerEstimatedToken is what estimateTokens takes a token to be: the average of
// the vocabularies kvroute serves on English prose (and llm-d's estimate without a
// tokenizer).
const bytesPerEstimatedToken = 4

// estimateTokens estimates the tokens of the rest bytes of a prompt its encoder did not
// reach. It is right for prose and wrong by design for the texts that make an encoder
// stop early: 4× too low for digits (a token each), 2× too high for a run of one letter
// and 32× for spaces (128 a token). A prompt that large holds at least max_prompt_tokens
// tokens or 256 KiB of long words, so its prefill outweighs a usual prompt's either way,
// and its booking ends at the engine's first response bytes: at once for an engine that
// refuses a prompt past its context. The estimate keeps the chosen worker's pending
// prefill (P) from reading as if the rest were free.
func estimateTokens(rest int) int {
	return (rest + bytesPerEstimatedToken - 1) / bytesPerEstimatedToken
}

func (p Prompter) fallback(reason string, err error) Prompt {
	return Prompt{Tokens: []uint32{}, Fallback: reason, FallbackErr: err}
}

// blocks hashes the full blocks of tokens, salted by the request's model, LoRA and cache
// salt.
func (p Prompter) blocks(req *Request, tokens []uint32) []uint64 {
	salt := index.Salt(req.Model, req.LoRA, req.CacheSalt)
	return index.BlockHashes(make([]uint64, 0, len(tokens)/p.BlockSize), tokens, p.BlockSize, salt)
}
