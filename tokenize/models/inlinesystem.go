package models

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// The values of an entry's messages_inline_system: vLLM's AnthropicInlineSystemOption.
const (
	InlineSystemAuto     = "auto"
	InlineSystemPreserve = string(openai.InlineSystemPreserve)
	InlineSystemFold     = string(openai.InlineSystemFold)
)

// inlineSystem is how a model's engine places an Anthropic Messages request's inline
// system messages: the entry's option, and for auto the mode probed from the model's
// template and tokenizer on first use, as vLLM's InlineSystemModeResolver does, once per
// entry (concurrent first callers wait for the one probe).
type inlineSystem struct {
	model  string // the entry's key, for the log
	option string // auto, preserve or fold
	// probe, for auto, picks the mode; nil when the entry has no template here (the
	// engine renders its chats), so auto cannot be resolved.
	probe func() (openai.InlineSystemMode, string)
	log   *slog.Logger

	once   sync.Once
	mode   openai.InlineSystemMode // "" when unknown
	reason string
}

// resolve returns the model's mode, "" when it cannot be known (auto without a
// template to probe).
func (s *inlineSystem) resolve() openai.InlineSystemMode {
	s.once.Do(func() {
		switch {
		case s.option != InlineSystemAuto:
			s.mode, s.reason = openai.InlineSystemMode(s.option), "set by messages_inline_system"
			return
		case s.probe == nil:
			s.reason = "the engine renders this model's chats, and kvroute cannot probe its template: set messages_inline_system to the engine's mode"
			s.log.Warn("tokenizers: Anthropic inline system messages are not rendered: "+s.reason, "model", s.model)
			return
		}
		// Kept if the probe panics: later calls fold, as vLLM does when its probe fails.
		s.mode, s.reason = openai.InlineSystemFold, "the probe did not finish"
		s.mode, s.reason = s.probe()
		place := "kept in place"
		if s.mode == openai.InlineSystemFold {
			place = "folded into adjacent turns"
		}
		s.log.Info("tokenizers: Anthropic inline system messages will be "+place+": "+s.reason, "model", s.model, "mode", string(s.mode))
	})
	return s.mode
}

// inlineSystemEncoder encodes a chat of a Messages request with inline system messages
// (Chat.Folded set) in its model's mode: Folded for fold, the chat itself for preserve.
type inlineSystemEncoder struct {
	inner tokenize.PromptEncoder
	mode  *inlineSystem
	// engine is set when inner asks the engine, which renders a Messages body itself
	// (its own inline_system option placing the system messages): such a body is
	// sent whatever the mode, its rebuilt chat unused.
	engine bool
}

func (e inlineSystemEncoder) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	if e.engine && p.BodyAPI == tokenize.APIMessages && p.Body != nil {
		return e.inner.EncodePrompt(ctx, p)
	}
	if p.Chat != nil && p.Chat.Folded != nil {
		switch e.mode.resolve() {
		case openai.InlineSystemFold:
			p.Chat = p.Chat.Folded
		case openai.InlineSystemPreserve:
		default:
			return tokenize.Encoding{}, fmt.Errorf("%w: inline system messages: %s", tokenize.ErrUnsupported, e.mode.reason)
		}
	}
	return e.inner.EncodePrompt(ctx, p)
}

// probeWith is the probe of a model rendered and encoded in process by pipe.
func probeWith(pipe tokenize.Pipeline) func() (openai.InlineSystemMode, string) {
	return func() (openai.InlineSystemMode, string) {
		render := func(chat *tokenize.Chat) (string, []uint32, bool) {
			enc, err := pipe.EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat})
			if err != nil || enc.Rest != 0 {
				return "", nil, false
			}
			return enc.Text, enc.IDs, true
		}
		var isAdded func(uint32) bool
		if added, ok := pipe.Tokenizer.(tokenize.AddedTokens); ok {
			isAdded = added.IsAddedToken
		}
		return openai.ProbeInlineSystem(render, isAdded)
	}
}
