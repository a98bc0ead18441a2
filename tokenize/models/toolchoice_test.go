package models_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// toolChoiceBodies are one conversation as each API's body, with the tools when tools
// is set, and toolChoice (a member, or "") after them. The Messages body has an inline
// system message, so that it comes with both inline_system forms.
var toolChoiceBodies = map[openai.Endpoint]func(tools bool, toolChoice string) string{
	openai.ChatCompletions: func(tools bool, toolChoice string) string {
		rest := toolChoice
		if tools {
			rest = `,"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city.",` +
				`"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]` + rest
		}
		return `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"}]` + rest + `}`
	},
	openai.Responses: func(tools bool, toolChoice string) string {
		rest := toolChoice
		if tools {
			rest = `,"tools":[{"type":"function","name":"get_weather","description":"Weather of a city.",` +
				`"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]` + rest
		}
		return `{"model":"m","instructions":"Be brief.","input":"Weather in Paris?"` + rest + `}`
	},
	openai.Messages: func(tools bool, toolChoice string) string {
		rest := toolChoice
		if tools {
			rest = `,"tools":[{"name":"get_weather","description":"Weather of a city.",` +
				`"input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]` + rest
		}
		return `{"model":"m","max_tokens":8,"system":"Be brief.","messages":[{"role":"user","content":"Weather in Paris?"},` +
			`{"role":"system","content":"<system-reminder>Note.</system-reminder>"}]` + rest + `}`
	},
}

// TestExcludeToolsWhenToolChoiceNone pins the entry option mirroring vLLM's
// --exclude-tools-when-tool-choice-none: set, a body whose tool_choice is "none" (a
// Responses and a Messages body too: vLLM renders them as chats, through the same
// check) encodes to the ids of the same body without tools; any other tool_choice
// keeps them. Unset, "none" keeps them, as vLLM's default server renders them, and as
// kvroute did before the option: a body encodes as it does without a tool_choice.
func TestExcludeToolsWhenToolChoiceNone(t *testing.T) {
	s, err := models.Load(models.Config{
		"off":  {Builtin: "qwen3"},
		"on":   {Builtin: "qwen3", ExcludeToolsWhenToolChoiceNone: true},
		"fold": {Builtin: "qwen3", ExcludeToolsWhenToolChoiceNone: true, MessagesInlineSystem: "fold"},
	}, models.Deps{})
	require.NoError(t, err)
	none := map[openai.Endpoint]string{
		openai.ChatCompletions: `,"tool_choice":"none"`,
		openai.Responses:       `,"tool_choice":"none"`,
		openai.Messages:        `,"tool_choice":{"type":"none"}`,
	}
	auto := map[openai.Endpoint]string{
		openai.ChatCompletions: `,"tool_choice":"auto"`,
		openai.Responses:       `,"tool_choice":"auto"`,
		openai.Messages:        `,"tool_choice":{"type":"auto"}`,
	}
	required := map[openai.Endpoint]string{
		openai.ChatCompletions: `,"tool_choice":"required"`,
		openai.Responses:       `,"tool_choice":"required"`,
		openai.Messages:        `,"tool_choice":{"type":"any"}`,
	}
	named := map[openai.Endpoint]string{
		openai.ChatCompletions: `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`,
		openai.Responses:       `,"tool_choice":{"type":"function","name":"get_weather"}`,
		openai.Messages:        `,"tool_choice":{"type":"tool","name":"get_weather"}`,
	}
	tests := []struct {
		name       string
		model      string
		toolChoice map[openai.Endpoint]string
		wantTools  bool
	}{
		{"set: none renders no tools", "on", none, false},
		{"set, inline system messages folded: none renders no tools", "fold", none, false},
		{"set: auto keeps them", "on", auto, true},
		{"set: required keeps them", "on", required, true},
		{"set: a named tool keeps them", "on", named, true},
		{"set: no tool_choice with tools is auto and keeps them", "on", nil, true},
		{"unset: none keeps them", "off", none, true},
		{"unset: auto keeps them", "off", auto, true},
	}
	for api, body := range toolChoiceBodies {
		for _, tt := range tests {
			t.Run(api.String()+": "+tt.name, func(t *testing.T) {
				withTools := encodeBody(t, s, tt.model, api, body(true, ""))
				require.Contains(t, withTools.Text, "get_weather", "the tools are in the prompt")
				withoutTools := encodeBody(t, s, tt.model, api, body(false, ""))
				require.NotContains(t, withoutTools.Text, "get_weather")

				chat := chatOf(t, api, body(true, tt.toolChoice[api]))
				enc, err := s.Model(tt.model).EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat})
				require.NoError(t, err)
				want := withoutTools
				if tt.wantTools {
					want = withTools
				}
				assert.Equal(t, want.Text, enc.Text)
				assert.Equal(t, want.IDs, enc.IDs)
				assert.NotNil(t, chat.Tools, "the caller's chat is left as it is")
			})
		}
	}
}

// TestExcludedToolsAreNoneNotAnEmptyList: vLLM passes tool_dicts None to the template,
// which templates tell from an empty list (`tools is not none`). A chat completion with
// an empty tools list and no tool_choice has vLLM's default tool_choice, "none" (an
// empty list does not make it "auto"), so a server with the flag renders it with no
// tools at all; the option does too, and unset it renders the empty list.
func TestExcludedToolsAreNoneNotAnEmptyList(t *testing.T) {
	dir := writeDir(t, filepath.Join(t.TempDir(), "m"),
		`{"bos_token": "<s>", "chat_template": "{{ bos_token }}{% if tools is not none %}b {% endif %}{% for m in messages %}{{ m.content }} {% endfor %}"}`, "")
	s, err := models.Load(models.Config{
		"off":             {Path: dir},
		"on":              {Path: dir, ExcludeToolsWhenToolChoiceNone: true},
		models.DefaultKey: approx,
	}, models.Deps{})
	require.NoError(t, err)
	const body = `{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[]}`
	assert.Equal(t, "<s>b a ", encodeBody(t, s, "off", openai.ChatCompletions, body).Text)
	assert.Equal(t, "<s>a ", encodeBody(t, s, "on", openai.ChatCompletions, body).Text)
	const auto = `{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[],"tool_choice":"auto"}`
	assert.Equal(t, "<s>b a ", encodeBody(t, s, "on", openai.ChatCompletions, auto).Text, "an explicit auto keeps the empty list")
}

// TestExcludeToolsWhenToolChoiceNoneIsValidated: an engine entry renders its chats on
// the engine, which applies its own flag, so the option is refused there, naming it.
func TestExcludeToolsWhenToolChoiceNoneIsValidated(t *testing.T) {
	tests := []struct {
		name  string
		entry models.Entry
		want  string // "" for valid
	}{
		{"with a builtin tokenizer", models.Entry{Builtin: "qwen3", ExcludeToolsWhenToolChoiceNone: true}, ""},
		{"with a path", models.Entry{Path: "x", ExcludeToolsWhenToolChoiceNone: true}, ""},
		{"with an engine", models.Entry{Engine: &engine.Config{URL: "http://r:8000"}, ExcludeToolsWhenToolChoiceNone: true},
			"tokenizers.m.exclude_tools_when_tool_choice_none: not read with engine"},
		{"with a local tokenizer and an engine", models.Entry{Path: "x", Engine: &engine.Config{URL: "http://r:8000"}, ExcludeToolsWhenToolChoiceNone: true},
			"tokenizers.m.exclude_tools_when_tool_choice_none: not read with engine"},
		{"unset with an engine", models.Entry{Engine: &engine.Config{URL: "http://r:8000"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := models.Config{"m": tt.entry}.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.want), "got %q, want it to start with %q", err, tt.want)
		})
	}
}

// encodeBody encodes a body of the API as the router does: the chat kvroute rebuilds from
// it, rendered and encoded by the model's entry.
func encodeBody(t *testing.T, s *models.Set, model string, api openai.Endpoint, body string) tokenize.Encoding {
	t.Helper()
	enc, err := s.Model(model).EncodePrompt(context.Background(), tokenize.Prompt{Chat: chatOf(t, api, body)})
	require.NoError(t, err)
	return enc
}

// chatOf is the chat kvroute rebuilds from a body of the API.
func chatOf(t *testing.T, api openai.Endpoint, body string) *tokenize.Chat {
	t.Helper()
	var c *tokenize.Chat
	var err error
	switch api {
	case openai.ChatCompletions:
		var req openai.Request
		req, err = openai.Parse(api, []byte(body), openai.DefaultLimits())
		c = req.Chat
	case openai.Responses:
		c, err = openai.ResponsesChat([]byte(body), openai.DefaultLimits())
	case openai.Messages:
		c, err = openai.MessagesChat([]byte(body), openai.DefaultLimits())
	default:
		t.Fatalf("no chat for API %v", api)
	}
	require.NoError(t, err)
	return c
}
