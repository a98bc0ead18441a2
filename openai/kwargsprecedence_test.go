package openai

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize/template"
)

// TestParseTopLevelFieldsWinOverTemplateKwargsAsTheNewestVLLM pins the precedence of a
// chat's chat_template_kwargs in the rendered prompt, as the newest vLLM has it
// (chat_completion/protocol.py build_chat_params at 002032ee2b18, renderers/params.py
// merge_kwargs, online_renderer.py preprocess_chat): merge_kwargs(chat_template_kwargs,
// {add_generation_prompt, continue_final_message, documents, ...}) lets the request's
// top-level fields win (documents only when set), and with_defaults merges the result
// over vLLM's defaults dropping the values merge_kwargs takes for unset (null and
// "auto"). Each body renders as its twin does, which says the same without the kwargs
// that lose.
func TestParseTopLevelFieldsWinOverTemplateKwargsAsTheNewestVLLM(t *testing.T) {
	const probe = `{% if x is defined %}x={{ x }}{% else %}no x{% endif %}|{{ documents | tojson }}|` +
		`{{ add_generation_prompt }}|{% for m in messages %}{{ m.content }};{% endfor %}`
	custom, err := template.New(probe, template.Tokens{}, template.Options{})
	require.NoError(t, err)
	qwen3 := qwen3Renderer(t)
	const user = `{"role":"user","content":"hi"}`
	const prefill = `{"role":"assistant","content":"Sure: "}`
	tests := []struct {
		name     string
		renderer *template.Renderer
		body     string
		twin     string
	}{
		{"the request's default generation prompt over the kwargs' false", qwen3,
			`{"messages":[` + user + `],"chat_template_kwargs":{"add_generation_prompt":false}}`,
			`{"messages":[` + user + `]}`},
		{"the request's false generation prompt over the kwargs' true", qwen3,
			`{"messages":[` + user + `],"add_generation_prompt":false,"chat_template_kwargs":{"add_generation_prompt":true}}`,
			`{"messages":[` + user + `],"add_generation_prompt":false}`},
		{"the request's default over the kwargs' continue_final_message", qwen3,
			`{"messages":[` + user + `,` + prefill + `],"chat_template_kwargs":{"continue_final_message":true}}`,
			`{"messages":[` + user + `,` + prefill + `]}`},
		{"the request's continuation over the kwargs' generation prompt", qwen3,
			`{"messages":[` + user + `,` + prefill + `],"add_generation_prompt":false,"continue_final_message":true,` +
				`"chat_template_kwargs":{"add_generation_prompt":true,"continue_final_message":false,"enable_thinking":false}}`,
			`{"messages":[` + user + `,` + prefill + `],"add_generation_prompt":false,"continue_final_message":true,` +
				`"chat_template_kwargs":{"enable_thinking":false}}`},
		{"the request's documents over the kwargs'", custom,
			`{"messages":[` + user + `],"documents":[{"title":"a","text":"b"}],"chat_template_kwargs":{"documents":[{"title":"c","text":"d"}]}}`,
			`{"messages":[` + user + `],"documents":[{"title":"a","text":"b"}]}`},
		{"the kwargs' documents when the request has none", custom,
			`{"messages":[` + user + `],"documents":null,"chat_template_kwargs":{"documents":[{"title":"c","text":"d"}]}}`,
			`{"messages":[` + user + `],"documents":[{"title":"c","text":"d"}]}`},
		{"a null kwarg is dropped", custom,
			`{"messages":[` + user + `],"chat_template_kwargs":{"x":null}}`,
			`{"messages":[` + user + `]}`},
		{"an \"auto\" kwarg is dropped", custom,
			`{"messages":[` + user + `],"chat_template_kwargs":{"x":"auto","documents":"auto"}}`,
			`{"messages":[` + user + `]}`},
		{"other kwargs are kept", custom,
			`{"messages":[` + user + `],"chat_template_kwargs":{"x":"on"}}`,
			`{"messages":[` + user + `],"chat_template_kwargs":{"x":"on","documents":null}}`},
	}
	render := func(t *testing.T, r *template.Renderer, body string) string {
		t.Helper()
		req, err := Parse(ChatCompletions, []byte(`{"model":"m",`+body[1:]), DefaultLimits())
		require.NoError(t, err)
		out, err := r.Render(req.Chat)
		require.NoError(t, err)
		return out
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, render(t, tt.renderer, tt.twin), render(t, tt.renderer, tt.body))
		})
	}
}
