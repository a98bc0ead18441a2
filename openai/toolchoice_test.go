package openai

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// TestToolChoiceNoneIsReadAsVLLMReadsIt pins which requests vLLM's
// --exclude-tools-when-tool-choice-none renders without their tools, the chat's
// ToolChoiceNone: its check is request.tool_choice == "none" on the chat completion
// vLLM renders (OnlineRenderer.render_chat), or on the Responses request
// (construct_tool_dicts). A chat completion's tool_choice defaults to "none", and to
// "auto" when tools are given (check_tool_usage on the raw body: data.get("tools") is
// falsy for an empty list); a Responses request's defaults to "auto"; a Messages
// request's {"type":"none"} becomes the chat's "none", and no tool_choice with tools
// "auto". Only the string "none" compares equal: a null, an object or another string
// keeps the tools.
func TestToolChoiceNoneIsReadAsVLLMReadsIt(t *testing.T) {
	const chatTool = `{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`
	chat := func(rest string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + rest + `}`
	}
	const responsesTool = `{"type":"function","name":"f","parameters":{"type":"object"}}`
	responses := func(rest string) string { return `{"model":"m","input":"hi"` + rest + `}` }
	const messagesTool = `{"name":"f","input_schema":{"type":"object"}}`
	messages := func(rest string) string {
		return `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]` + rest + `}`
	}
	tests := []struct {
		name string
		api  Endpoint
		body string
		want bool
	}{
		{"chat: the string none", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"none"`), true},
		{"chat: none before the tools", ChatCompletions, chat(`,"tool_choice":"none","tools":[` + chatTool + `]`), true},
		{"chat: none written with an escape", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"\u006eone"`), true},
		{"chat: auto", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"auto"`), false},
		{"chat: required", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"required"`), false},
		{"chat: a named function", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":{"type":"function","function":{"name":"f"}}`), false},
		{"chat: an object of type none is not the string", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":{"type":"none"}`), false},
		{"chat: null is None, not none", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":null`), false},
		{"chat: another case is another string", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"None"`), false},
		{"chat: absent with tools is auto", ChatCompletions, chat(`,"tools":[` + chatTool + `]`), false},
		{"chat: absent with an empty tools list is the default none", ChatCompletions, chat(`,"tools":[]`), true},
		{"chat: absent with null tools is the default none", ChatCompletions, chat(`,"tools":null`), true},
		{"chat: absent without tools is the default none", ChatCompletions, chat(``), true},
		{"chat: the last of two wins (auto)", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"none","tool_choice":"auto"`), false},
		{"chat: the last of two wins (none)", ChatCompletions, chat(`,"tools":[` + chatTool + `],"tool_choice":"auto","tool_choice":"none"`), true},

		{"responses: the string none", Responses, responses(`,"tools":[` + responsesTool + `],"tool_choice":"none"`), true},
		{"responses: auto", Responses, responses(`,"tools":[` + responsesTool + `],"tool_choice":"auto"`), false},
		{"responses: required", Responses, responses(`,"tools":[` + responsesTool + `],"tool_choice":"required"`), false},
		{"responses: a named function", Responses, responses(`,"tools":[` + responsesTool + `],"tool_choice":{"type":"function","name":"f"}`), false},
		{"responses: absent is auto", Responses, responses(`,"tools":[` + responsesTool + `]`), false},

		{"messages: type none", Messages, messages(`,"tools":[` + messagesTool + `],"tool_choice":{"type":"none"}`), true},
		{"messages: type auto", Messages, messages(`,"tools":[` + messagesTool + `],"tool_choice":{"type":"auto"}`), false},
		{"messages: type any is required", Messages, messages(`,"tools":[` + messagesTool + `],"tool_choice":{"type":"any"}`), false},
		{"messages: a named tool", Messages, messages(`,"tools":[` + messagesTool + `],"tool_choice":{"type":"tool","name":"f"}`), false},
		{"messages: absent with tools is auto", Messages, messages(`,"tools":[` + messagesTool + `]`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := chatOf(t, tt.api, tt.body)
			assert.Equal(t, tt.want, c.ToolChoiceNone)
		})
	}
}

// TestToolChoiceNoneReachesBothFormsOfAMessagesChat: a Messages body with inline
// system messages gives two chats, one per inline_system mode; the model's mode picks
// the one rendered, so both carry its tool_choice.
func TestToolChoiceNoneReachesBothFormsOfAMessagesChat(t *testing.T) {
	body := `{"model":"m","max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":"hi"},` +
		`{"role":"system","content":"<system-reminder>Note.</system-reminder>"}],` +
		`"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"none"}}`
	c := chatOf(t, Messages, body)
	require.NotNil(t, c.Folded)
	assert.True(t, c.ToolChoiceNone)
	assert.True(t, c.Folded.ToolChoiceNone)
	assert.NotNil(t, c.Tools)
	assert.NotNil(t, c.Folded.Tools)
}

// TestReadingToolChoiceKeepsParseErrors: tool_choice was skipped before it was read,
// so a body whose tool_choice is malformed JSON gets the error it got then, the one
// any skipped field gets (Tool_choice, of the same length, is not read).
func TestReadingToolChoiceKeepsParseErrors(t *testing.T) {
	for _, value := range []string{`tru`, `"no`, `"\x"`, `[1,]`, `{"a"}`, `-`} {
		t.Run(value, func(t *testing.T) {
			_, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[],"tool_choice":`+value+`}`), DefaultLimits())
			require.Error(t, err)
			_, skipped := Parse(ChatCompletions, []byte(`{"model":"m","messages":[],"Tool_choice":`+value+`}`), DefaultLimits())
			require.Error(t, skipped)
			assert.Equal(t, skipped.Error(), err.Error())
		})
	}
}

// chatOf is the chat kvroute rebuilds from a body of the API.
func chatOf(t *testing.T, api Endpoint, body string) *tokenize.Chat {
	t.Helper()
	var c *tokenize.Chat
	var err error
	switch api {
	case ChatCompletions:
		var req Request
		req, err = Parse(api, []byte(body), DefaultLimits())
		c = req.Chat
	case Responses:
		c, err = ResponsesChat([]byte(body), DefaultLimits())
	case Messages:
		c, err = MessagesChat([]byte(body), DefaultLimits())
	}
	require.NoError(t, err)
	return c
}
