package builtin

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	assert.Equal(t, []string{"qwen3"}, Names())
}

func TestQwen3FilesAreTheRealOnes(t *testing.T) {
	tok, err := TokenizerJSON("qwen3")
	require.NoError(t, err)
	var tj struct {
		Model struct {
			Type  string            `json:"type"`
			Vocab map[string]uint32 `json:"vocab"`
		} `json:"model"`
	}
	require.NoError(t, json.Unmarshal(tok, &tj))
	assert.Equal(t, "BPE", tj.Model.Type)
	assert.Len(t, tj.Model.Vocab, 151643)

	cfg, err := TokenizerConfigJSON("qwen3")
	require.NoError(t, err)
	var tc struct {
		ChatTemplate string `json:"chat_template"`
		EOSToken     string `json:"eos_token"`
	}
	require.NoError(t, json.Unmarshal(cfg, &tc))
	assert.Contains(t, tc.ChatTemplate, "<|im_start|>")
	assert.Equal(t, "<|im_end|>", tc.EOSToken)
}

func TestUnknownModel(t *testing.T) {
	for _, name := range []string{"", ".", "llama", "qwen3/..", "../qwen3"} {
		_, err := TokenizerJSON(name)
		assert.Error(t, err, name)
	}
}
