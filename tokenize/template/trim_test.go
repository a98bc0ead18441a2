package template

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
)

// Jinja2's trim filter is Python's str.strip(), which strips U+001C–U+001F besides what
// Go's strings.TrimSpace strips; the library's trim filter is TrimSpace. The expected
// prompts are Jinja2 3.1.6's, configured and fed as testdata/gen/gen.py does.
func TestTrimStripsWhatPythonsStripStrips(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"\u001cBe brief.\u001f"},{"role":"user","content":"Hi\u001e\n"},{"role":"assistant","content":"\u001d ok \u001f"}]}`
	req, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
	require.NoError(t, err)
	want := map[string]string{
		llama31Model: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		llama30Model: "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		// No direct renderer: the library's path alone.
		"library/gemma3:270m": "<|begin_of_text|><start_of_turn>user\n\x1cBe brief.\x1f\n\nHi<end_of_turn>\n<start_of_turn>model\nok<end_of_turn>\n<start_of_turn>model\n",
	}
	for model, want := range want {
		r, err := New(templatecorpus.Ollama(t, model), llama3Tokens, Options{Now: func() time.Time { return llama3Clock }})
		require.NoError(t, err)
		for way, r := range map[string]*Renderer{"direct": r, "jinja": withoutDirect(r)} {
			got, err := r.Render(req.Chat)
			require.NoError(t, err, model)
			assert.Equal(t, want, got, "%s, %s", model, way)
		}
	}

	// The filter's other forms: explicit characters, a value that is not a string.
	r, err := New(`[{{ messages[0].content | trim }}][{{ messages[0].content | trim('\x1c') }}][{{ 5 | trim }}]{% filter trim %} {{ messages[0].content }} {% endfilter %}`, Tokens{}, Options{})
	require.NoError(t, err)
	req, err = openai.Parse(openai.ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user","content":"\u001c a \u001f"}]}`), openai.DefaultLimits())
	require.NoError(t, err)
	got, err := r.Render(req.Chat)
	require.NoError(t, err)
	assert.Equal(t, "[a][ a \x1f][5]a", got)
}
