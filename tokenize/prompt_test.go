package tokenize

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// specialsTokenizer records the addSpecialTokens it is asked for and answers one id.
type specialsTokenizer struct{ got []bool }

func (s *specialsTokenizer) Encode(_ string, addSpecialTokens bool) ([]uint32, error) {
	s.got = append(s.got, addSpecialTokens)
	return []uint32{1}, nil
}

// TestPipelineAddSpecialTokens pins vLLM's add_special_tokens: by default a completions
// text is encoded with the tokenizer's special tokens (a BOS) and a rendered chat
// without, and the request's add_special_tokens overrides either default.
func TestPipelineAddSpecialTokens(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name     string
		prompt   Prompt
		wantAdds bool
	}{
		{"completions default", Prompt{Text: "x"}, true},
		{"completions add_special_tokens false", Prompt{Text: "x", AddSpecialTokens: &no}, false},
		{"chat default", Prompt{Chat: TextChat("user", "x")}, false},
		{"chat add_special_tokens true", Prompt{Chat: TextChat("user", "x"), AddSpecialTokens: &yes}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := &specialsTokenizer{}
			_, err := Pipeline{Tokenizer: tok, Renderer: ChatML{}}.EncodePrompt(context.Background(), tt.prompt)
			require.NoError(t, err)
			assert.Equal(t, []bool{tt.wantAdds}, tok.got)
		})
	}
}

// TestPipelineStopsAtMaxTokens: with MaxTokens, a tokenizer that can stop early returns
// the prompt's first ids and the bytes it left out (Approx's are exact); without, or
// for a prompt that fits, the whole prompt.
func TestPipelineStopsAtMaxTokens(t *testing.T) {
	text := "ab cd ef gh ij" // Approx: 5 pieces
	whole, err := Approx{}.Encode(text, true)
	require.NoError(t, err)
	require.Len(t, whole, 5)
	tests := []struct {
		name      string
		maxTokens int
		buffers   *Buffers
		wantIDs   []uint32
		wantRest  int
	}{
		{"no bound", 0, nil, whole, 0},
		{"a bound the prompt fits", 5, nil, whole, 0},
		{"cut after three ids", 3, nil, whole[:3], len(" gh ij")},
		{"cut into the caller's buffers", 1, &Buffers{IDs: make([]uint32, 0, 8)}, whole[:1], len(" cd ef gh ij")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, err := Pipeline{Tokenizer: Approx{}, MaxTokens: tt.maxTokens}.EncodePrompt(context.Background(), Prompt{Text: text, Buffers: tt.buffers})
			require.NoError(t, err)
			assert.Equal(t, tt.wantIDs, enc.IDs)
			assert.Equal(t, tt.wantRest, enc.Rest)
			assert.Equal(t, text, enc.Text)
		})
	}
}

// cancellingRenderer renders a chat as ChatML and ends its context meanwhile: the
// caller giving up while the chat is rendered.
type cancellingRenderer struct{ cancel context.CancelFunc }

func (c cancellingRenderer) Render(chat *Chat) (string, error) {
	c.cancel()
	return ChatML{}.Render(chat)
}

// TestPipelineDoesNotEncodeAChatWhoseRequestWentWhileItWasRendered: Envoy gives up on a
// stream (its message_timeout) while kvroute is busy; under overload, rendering and
// encoding for streams already gone only lengthens the backlog. A chat whose context
// ended during the render is not encoded, and the context's error comes back.
func TestPipelineDoesNotEncodeAChatWhoseRequestWentWhileItWasRendered(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tok := &specialsTokenizer{}
	_, err := Pipeline{Tokenizer: tok, Renderer: cancellingRenderer{cancel}}.EncodePrompt(ctx, Prompt{Chat: TextChat("user", "x")})
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, tok.got, "the rendered chat was encoded")
}
