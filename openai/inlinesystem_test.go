package openai

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// Messages of the inline system tests, Anthropic's and the chat completion's.
const (
	isUser  = `{"role":"user","content":"q"}`
	isAsst  = `{"role":"assistant","content":"a"}`
	isCall  = `{"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"c1","name":"f","input":{}}]}`
	isCallC = `{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}],"content":"t"}`
	isSys   = `{"role":"system","content":"S"}`
)

func isSystem(text string) string { return `{"role":"system","content":"` + text + `"}` }

// TestMessagesChatPlacesInlineSystemMessages pins normalize_inline_system's rules, in
// both modes, against chats derived by hand from vLLM's inline_system.py: preserve is
// the chat, fold is Folded (or the chat when preserve folds too: no system text).
func TestMessagesChatPlacesInlineSystemMessages(t *testing.T) {
	tests := []struct {
		name     string
		system   string // the request's system field, "" for none
		messages []string
		preserve []string // nil: preserve folds too (Folded nil)
		fold     []string
	}{
		{"mid-conversation: folded before the next user's text", `"S"`,
			[]string{isUser, isAsst, isSystem("n"), `{"role":"user","content":"q2"}`},
			[]string{isSys, isUser, isAsst, isSystem("n"), `{"role":"user","content":"q2"}`},
			[]string{isSys, isUser, isAsst, `{"role":"user","content":"n\n\nq2"}`}},
		{"trailing after a user message: appended to its text", `"S"`,
			[]string{isUser, isSystem("n1"), isSystem("n2")},
			[]string{isSys, isUser, isSystem("n1"), isSystem("n2")},
			[]string{isSys, `{"role":"user","content":"q\n\nn1\n\nn2"}`}},
		{"trailing after an assistant message: a user message of its own", `"S"`,
			[]string{isUser, isAsst, isSystem("n")},
			[]string{isSys, isUser, isAsst, isSystem("n")},
			[]string{isSys, isUser, isAsst, `{"role":"user","content":"n"}`}},
		{"between tool_use and tool_result: moved after the results, folded into the last", `"S"`,
			[]string{isUser, isCall, isSystem("between"), `{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"out"}]}`, isSystem("after")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"out"}`, isSystem("between"), isSystem("after")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"out\n\nbetween\n\nafter"}`}},
		{"after tool results with text: appended to the user's own text", `"S"`,
			[]string{isUser, isCall, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"out"},{"type":"text","text":"go on"}]}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"out"}`, `{"role":"user","content":"go on"}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"out"}`, `{"role":"user","content":"go on\n\nn"}`}},
		{"a tool result of text items: merged into the last", `"S"`,
			[]string{isUser, isCall, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"a\nb"}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"a\nb\n\nn"}`}},
		{"a tool result without content: the text is its content", `"S"`,
			[]string{isUser, isCall, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1"}]}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":""}`, isSystem("n")},
			[]string{isSys, isUser, isCallC, `{"role":"tool","tool_call_id":"c1","content":"n"}`}},
		{"pending before blocks: merged into the first text block", `"S"`,
			[]string{isUser, isAsst, isSystem("n"), `{"role":"user","content":[{"type":"text","text":"q2","cache_control":{"type":"ephemeral"}},{"type":"text","text":"more"}]}`},
			[]string{isSys, isUser, isAsst, isSystem("n"), `{"role":"user","content":[{"type":"text","text":"q2"},{"type":"text","text":"more"}]}`},
			[]string{isSys, isUser, isAsst, `{"role":"user","content":[{"type":"text","text":"n\n\nq2"},{"type":"text","text":"more"}]}`}},
		{"pending before tool results: a text block first, a user message after the tool's", `"S"`,
			[]string{isUser, isAsst, isSystem("n"), `{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"o"}]}`},
			[]string{isSys, isUser, isAsst, isSystem("n"), `{"role":"tool","tool_call_id":"c1","content":"o"}`},
			[]string{isSys, isUser, isAsst, `{"role":"tool","tool_call_id":"c1","content":"o"}`, `{"role":"user","content":"n"}`}},
		{"pending before an assistant: joined in a user message", `"S"`,
			[]string{isUser, isAsst, isSystem("n1"), isSystem("n2"), `{"role":"assistant","content":"a2"}`},
			[]string{isSys, isUser, isAsst, isSystem("n1"), isSystem("n2"), `{"role":"assistant","content":"a2"}`},
			[]string{isSys, isUser, isAsst, `{"role":"user","content":"n1\n\nn2"}`, `{"role":"assistant","content":"a2"}`}},
		{"no system prompt: preserve folds too", ``,
			[]string{isUser, isAsst, isSystem("n"), `{"role":"user","content":"q2"}`},
			nil,
			[]string{isUser, isAsst, `{"role":"user","content":"n\n\nq2"}`}},
		{"a system prompt of the billing header alone is none", `[{"type":"text","text":"x-anthropic-billing-header: a"}]`,
			[]string{isUser, isSystem("n")},
			nil,
			[]string{`{"role":"user","content":"q\n\nn"}`}},
		{"leading system text is a system prompt", ``,
			[]string{isSystem("L"), isUser, isSystem("n")},
			[]string{isSystem("L"), isUser, isSystem("n")},
			[]string{isSystem("L"), `{"role":"user","content":"q\n\nn"}`}},
		{"billing headers and empty texts are left out", `"S"`,
			[]string{isUser, `{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"n"}]}`,
				isSystem(""), isSystem("x-anthropic-billing-header: b"), isAsst},
			[]string{isSys, isUser, isSystem("n"), isAsst},
			[]string{isSys, `{"role":"user","content":"q\n\nn"}`, isAsst}},
		{"a first user message of no content takes the text", `"S"`,
			[]string{`{"role":"user","content":[]}`, isSystem("n")},
			[]string{isSys, isSystem("n")},
			[]string{isSys, `{"role":"user","content":"n"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","max_tokens":10,"messages":[` + strings.Join(tt.messages, ",") + `]`
			if tt.system != "" {
				body += `,"system":` + tt.system
			}
			chat := messagesChat(t, body+`}`)
			twin := func(messages []string) *tokenize.Chat {
				req, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[`+strings.Join(messages, ",")+`]}`), DefaultLimits())
				require.NoError(t, err)
				return req.Chat
			}
			if tt.preserve == nil {
				assert.Nil(t, chat.Folded, "both modes fold")
				assert.Equal(t, chatDump(twin(tt.fold)), chatDump(chat))
				return
			}
			assert.Equal(t, chatDump(twin(tt.preserve)), chatDump(&tokenize.Chat{Messages: chat.Messages, Tools: chat.Tools,
				TemplateKwargs: chat.TemplateKwargs, AddGenerationPrompt: chat.AddGenerationPrompt}), "preserve")
			require.NotNil(t, chat.Folded)
			assert.Equal(t, chatDump(twin(tt.fold)), chatDump(chat.Folded), "fold")
			assert.Nil(t, chat.Folded.Folded)
		})
	}
}

// TestMessagesChatWithoutInlineSystemHasNoFolded pins that a body whose system
// messages all lead messages, or have no text, gives one chat.
func TestMessagesChatWithoutInlineSystemHasNoFolded(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","system":"S","messages":[` + isUser + `]}`,
		`{"model":"m","system":"S","messages":[` + isSystem("L") + `,` + isUser + `]}`,
		`{"model":"m","system":"S","messages":[` + isUser + `,` + isSystem("") + `]}`,
	} {
		assert.Nil(t, messagesChat(t, body).Folded, body)
	}
}

// claudeCodeTurns is the Claude Code conversation of testdata as the turns a client
// sends: each turn appends the assistant's answer, the next user message (a tool result
// when the answer calls a tool) and a system message, as Claude Code does.
func claudeCodeTurns(t *testing.T) []map[string]any {
	t.Helper()
	b, err := os.ReadFile("testdata/messages_claude_code.json")
	require.NoError(t, err)
	var req map[string]any
	require.NoError(t, json.Unmarshal(b, &req))
	copyReq := func(messages []any) map[string]any {
		out := map[string]any{}
		for k, v := range req {
			out[k] = v
		}
		out["messages"] = append([]any(nil), messages...)
		return out
	}
	messages := append(req["messages"].([]any), map[string]any{"role": "system", "content": "<system-reminder>Turn 1 note.</system-reminder>"})
	turns := []map[string]any{copyReq(messages)}
	messages = append(messages,
		// No thinking: Qwen3's template drops the reasoning before the last user query,
		// which changes the prompt once the next query comes, inline system or not.
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "tool_use", "id": "toolu_run", "name": "Bash", "input": map[string]any{"command": "go test ./openai/"}}}},
		map[string]any{"role": "system", "content": "<system-reminder>Between the call and its result.</system-reminder>"},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_run", "content": "ok"}}},
		map[string]any{"role": "system", "content": []any{map[string]any{"type": "text", "text": "<system-reminder>Turn 2 note.</system-reminder>"}}})
	turns = append(turns, copyReq(messages))
	messages = append(messages,
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "All tests pass."}}},
		map[string]any{"role": "user", "content": "Commit it."},
		map[string]any{"role": "system", "content": "<system-reminder>Turn 3 note.</system-reminder>"})
	return append(turns, copyReq(messages))
}

// TestMessagesChatOfClaudeCodeInlineSystemExtendsThePrompt pins the prefix property
// both modes keep: when the client appends a system message every turn, turn N+1's
// prompt (Qwen3's template) extends turn N's up to its generation prompt, in either
// mode; and preserve's prompt has the notes as system turns.
func TestMessagesChatOfClaudeCodeInlineSystemExtendsThePrompt(t *testing.T) {
	qwen3 := qwen3Renderer(t)
	var prev [2]string
	for i, req := range claudeCodeTurns(t) {
		b, err := json.Marshal(req)
		require.NoError(t, err)
		chat, err := MessagesChat(b, DefaultLimits())
		require.NoError(t, err, "turn %d", i+1)
		require.NotNil(t, chat.Folded, "turn %d", i+1)
		for m, c := range []*tokenize.Chat{chat, chat.Folded} {
			prompt, err := qwen3.Render(c)
			require.NoError(t, err, "turn %d", i+1)
			assert.Contains(t, prompt, "Turn "+string(rune('1'+i))+" note.")
			if m == 0 {
				assert.Contains(t, prompt, "<|im_start|>system\n<system-reminder>Turn "+string(rune('1'+i)))
			}
			if prev[m] != "" {
				cut := strings.LastIndex(prev[m], "<|im_start|>assistant\n")
				assert.True(t, strings.HasPrefix(prompt, prev[m][:cut]), "turn %d extends turn %d (mode %d)", i+1, i, m)
			}
			prev[m] = prompt
		}
	}
}
