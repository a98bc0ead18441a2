package openai

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// For a field given twice, Python's json keeps the last value: pydantic never sees the
// first, so nothing in it can be the request's error.
func TestAFieldGivenTwiceIsJudgedOnItsLastValueAlone(t *testing.T) {
	for _, tt := range []struct{ body, prompt string }{
		{`{"model":"m","prompt":[-1],"prompt":"hi"}`, "hi"},
		{`{"model":"m","prompt":[1,"x",2],"prompt":"hi"}`, "hi"},
		{`{"model":"m","prompt":[[1],[4294967296]],"prompt":"hi"}`, "hi"},
		{`{"model":"m","prompt":[[1,-1]],"prompt":"hi"}`, "hi"},
		{`{"model":"m","prompt":["a",-1],"prompt":"hi"}`, "hi"},
		{`{"model":"m","prompt_embeds":5,"prompt_embeds":null,"prompt":"hi"}`, "hi"},
	} {
		got, err := Parse(Completions, []byte(tt.body), DefaultLimits())
		if !assert.NoError(t, err, tt.body) {
			continue
		}
		assert.Equal(t, tt.prompt, got.Prompt, tt.body)
		assert.Nil(t, got.Tokens, tt.body)
	}
	// The last value is judged.
	_, err := Parse(Completions, []byte(`{"model":"m","prompt":"hi","prompt":[-1]}`), DefaultLimits())
	require.Error(t, err)
	_, err = Parse(Completions, []byte(`{"model":"m","prompt":"hi","prompt_embeds":null,"prompt_embeds":5}`), DefaultLimits())
	require.Error(t, err)
}
