package openai_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/openai"
)

// h74: vLLM's CompletionRequest.prompt is list[int] | list[list[int]] | str | list[str],
// validated by pydantic in lax mode: when no member matches strictly, list[int] takes
// integral floats (100.0, 1e2) as it does for max_tokens, which kvroute already reads
// laxly (pydantic 2.13.4: [1.0,2.0,3.0] → [1,2,3], [1e2,7] → [100,7], [true,2] →
// [1,2]; [1.5] is refused). kvroute refuses such a token-id prompt with a 400 the engine would serve.
func TestH74IntegralFloatTokenIDs(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","prompt":[1.0,2.0,3.0]}`,
		`{"model":"m","prompt":[1e2,7]}`,
		`{"model":"m","prompt":[[1.0,2]]}`,
		`{"model":"m","prompt":[true,2]}`,
	} {
		req, err := openai.Parse(openai.Completions, []byte(body), openai.DefaultLimits())
		if assert.NoError(t, err, body) {
			assert.NotEmpty(t, req.Tokens, body)
		}
	}
}
