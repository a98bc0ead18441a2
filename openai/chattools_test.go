package openai

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseChatToolsRenderAsTheNewestVLLMDumpsThem pins the tools a chat's template
// prints, as the newest vLLM dumps them for its template (tool.model_dump() in
// online_renderer.py render_chat): ChatCompletionToolsParam (chat_completion/
// protocol.py at 002032ee2b18) and FunctionDefinition (generate/base/protocol.py) keep
// their declared fields only: type, function, and the tool's defer_loading when not
// null; the function's name, description and parameters (null when absent), strict and
// defer_loading when not null, the tool's defer_loading copied into a function without
// one. Codex sends its tools with "defer_loading": null. Rendered by the embedded
// Qwen3 template, which prints each tool with tojson on a line of its own.
func TestParseChatToolsRenderAsTheNewestVLLMDumpsThem(t *testing.T) {
	tests := []struct {
		name string
		tool string
		want string
	}{
		{"a null defer_loading on the function is dropped",
			`{"type":"function","function":{"name":"f","description":"F.","parameters":{"type":"object"},"strict":false,"defer_loading":null}}`,
			`{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}, "strict": false}}`},
		{"a null defer_loading on the tool is dropped",
			`{"type":"function","function":{"name":"f"},"defer_loading":null}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}`},
		{"a null strict is dropped",
			`{"type":"function","function":{"name":"f","strict":null,"description":null}}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}`},
		{"the function's defer_loading after strict, in declaration order",
			`{"function":{"defer_loading":true,"strict":true,"name":"f"}}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "strict": true, "defer_loading": true}}`},
		{"the tool's defer_loading kept and copied into the function",
			`{"defer_loading":false,"type":"function","function":{"name":"f"}}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": false}, "defer_loading": false}`},
		{"the function's own defer_loading over the tool's",
			`{"type":"function","function":{"name":"f","defer_loading":true},"defer_loading":false}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": true}, "defer_loading": false}`},
		{"keys the models do not declare are left out",
			`{"type":"function","function":{"name":"f","x_fn":1},"x_tool":2}`,
			`{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}`},
	}
	qwen3 := qwen3Renderer(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[` + tt.tool + `]}`
			req, err := Parse(ChatCompletions, []byte(body), DefaultLimits())
			require.NoError(t, err)
			out, err := qwen3.Render(req.Chat)
			require.NoError(t, err)
			start := strings.Index(out, "<tools>\n")
			end := strings.Index(out, "\n</tools>")
			require.True(t, start >= 0 && end > start, "no tools block in %q", out)
			assert.Equal(t, tt.want, out[start+len("<tools>\n"):end])
		})
	}
}
