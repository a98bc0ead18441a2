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
			_, _, err := Pipeline{Tokenizer: tok, Renderer: ChatML{}}.EncodePrompt(context.Background(), tt.prompt)
			require.NoError(t, err)
			assert.Equal(t, []bool{tt.wantAdds}, tok.got)
		})
	}
}
