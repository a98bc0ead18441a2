package openai

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize/template"
)

// chatBody is a chat completions body with one user message and the extra members.
func chatBody(extra string) string {
	return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`
}

// TestParseReasoningEffortMergesAsTheLatestVLLM pins how Parse merges a chat request's
// reasoning_effort into its template kwargs, as the latest vLLM's
// ChatCompletionRequest.build_chat_params does (vllm/entrypoints/openai/chat_completion/
// protocol.py at 002032ee2b18): merge_kwargs(chat_template_kwargs, {..., reasoning_effort})
// lets a set effort override the kwargs' own and a null one leave them alone; a set
// effort also sets enable_thinking (effort other than "none") unless the request's
// kwargs have that key, whatever its value. The renderer reads the kwargs in order, a
// later key overriding an earlier one.
func TestParseReasoningEffortMergesAsTheLatestVLLM(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  string // the chat's TemplateKwargs as compact JSON
	}{
		{"no effort and no kwargs give no kwargs", ``, `null`},
		{"a null effort gives no kwargs", `,"reasoning_effort":null`, `null`},
		{"a null effort leaves the request's kwargs alone",
			`,"reasoning_effort":null,"chat_template_kwargs":{"reasoning_effort":"low"}`, `{"reasoning_effort":"low"}`},
		{"an effort sets reasoning_effort and turns thinking on",
			`,"reasoning_effort":"high"`, `{"reasoning_effort":"high","enable_thinking":true}`},
		{"effort none turns thinking off",
			`,"reasoning_effort":"none"`, `{"reasoning_effort":"none","enable_thinking":false}`},
		{"the effort overrides the request's kwargs' reasoning_effort",
			`,"chat_template_kwargs":{"reasoning_effort":"low","k":1},"reasoning_effort":"medium"`,
			`{"reasoning_effort":"low","k":1,"reasoning_effort":"medium","enable_thinking":true}`},
		{"the request's enable_thinking is kept",
			`,"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}`,
			`{"enable_thinking":true,"reasoning_effort":"none"}`},
		{"the request's enable_thinking is kept even when null",
			`,"reasoning_effort":"low","chat_template_kwargs":{"enable_thinking":null}`,
			`{"enable_thinking":null,"reasoning_effort":"low"}`},
		{"the last reasoning_effort given counts",
			`,"reasoning_effort":"low","reasoning_effort":null`, `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(ChatCompletions, []byte(chatBody(tt.extra)), DefaultLimits())
			require.NoError(t, err)
			require.NotNil(t, got.Chat)
			assert.Equal(t, tt.want, string(got.Chat.TemplateKwargs.AppendCompact(nil)))
		})
	}
}

// TestParseReasoningEffortOfTheWrongType pins that a chat's reasoning_effort other than
// a string or null is a *FieldError on reasoning_effort, as vLLM's pydantic model
// refuses it, and that completions requests do not read the field.
func TestParseReasoningEffortOfTheWrongType(t *testing.T) {
	for _, v := range []string{`1`, `true`, `["low"]`, `{"effort":"low"}`} {
		t.Run(v, func(t *testing.T) {
			_, err := Parse(ChatCompletions, []byte(chatBody(`,"reasoning_effort":`+v)), DefaultLimits())
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "%v", err)
			assert.True(t, errors.Is(err, ErrBadRequest))
			assert.Equal(t, "reasoning_effort", fe.Param)

			got, err := Parse(Completions, []byte(`{"model":"m","prompt":"p","reasoning_effort":`+v+`}`), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, "p", got.Prompt)
		})
	}
}

// TestParseReasoningEffortRendersAsTheEngine pins the render: a template that prints
// reasoning_effort and enable_thinking (as gpt-oss's prints the effort in its system
// prompt) gets the request's top-level effort, over its chat_template_kwargs.
func TestParseReasoningEffortRendersAsTheEngine(t *testing.T) {
	const src = `{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}{% else %}-{% endif %}|` +
		`{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}-{% endif %}|` +
		`{% for m in messages %}{{ m.content }};{% endfor %}`
	r, err := template.New(src, template.Tokens{}, template.Options{})
	require.NoError(t, err)
	tests := []struct {
		name  string
		extra string
		want  string
	}{
		{"no effort", ``, `-|-|hi;`},
		{"an effort", `,"reasoning_effort":"high"`, `Reasoning: high|True|hi;`},
		{"the effort over the kwargs'",
			`,"reasoning_effort":"low","chat_template_kwargs":{"reasoning_effort":"high","enable_thinking":false}`,
			`Reasoning: low|False|hi;`},
		{"the kwargs' when the effort is null",
			`,"reasoning_effort":null,"chat_template_kwargs":{"reasoning_effort":"high"}`, `Reasoning: high|-|hi;`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(ChatCompletions, []byte(chatBody(tt.extra)), DefaultLimits())
			require.NoError(t, err)
			out, err := r.Render(got.Chat)
			require.NoError(t, err)
			assert.Equal(t, tt.want, out)
		})
	}
}
