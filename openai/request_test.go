package openai

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name     string
		endpoint Endpoint
		body     string
		prompt   string
		tokens   []uint32
		rendered string // the chat through tokenize.ChatML
		stream   bool
		salt     string
	}{
		{name: "chat with text parts", endpoint: ChatCompletions,
			body:     `{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`,
			rendered: "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n", stream: true},
		{name: "assistant tool call without content", endpoint: ChatCompletions,
			body:     `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
			rendered: `<|im_start|>assistant` + "\n" + `[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]<|im_end|>` + "\n<|im_start|>assistant\n"},
		{name: "a later duplicate field wins", endpoint: ChatCompletions,
			body:     `{"model":1,"messages":[],"model":"m","messages":[{"role":"user","content":"x"}]}`,
			rendered: "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"},
		{name: "completions string", endpoint: Completions, body: `{"model":"m","prompt":"hi","cache_salt":"tenant-a"}`, prompt: "hi", salt: "tenant-a"},
		{name: "completions empty string", endpoint: Completions, body: `{"model":"m","prompt":""}`, prompt: ""},
		{name: "completions batch routes by the first prompt", endpoint: Completions, body: `{"model":"m","prompt":["first","second"]}`, prompt: "first"},
		{name: "completions token ids", endpoint: Completions, body: `{"model":"m","prompt":[1, 2 ,3]}`, tokens: []uint32{1, 2, 3}},
		{name: "completions batch of token ids", endpoint: Completions, body: `{"model":"m","prompt":[[4,5],[6]]}`, tokens: []uint32{4, 5}},
		{name: "messages ignored on completions", endpoint: Completions, body: `{"model":"m","prompt":"p","messages":7}`, prompt: "p"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.endpoint, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, "m", got.Model)
			assert.Equal(t, tt.stream, got.Stream)
			assert.Equal(t, tt.prompt, got.Prompt)
			assert.Equal(t, tt.tokens, got.Tokens)
			assert.Equal(t, tt.salt, got.CacheSalt)
			if tt.endpoint == ChatCompletions {
				require.NotNil(t, got.Chat)
				text, err := tokenize.ChatML{}.Render(got.Chat)
				require.NoError(t, err)
				assert.Equal(t, tt.rendered, text)
			} else {
				assert.Nil(t, got.Chat)
			}
		})
	}
}

func TestParseChatFields(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"x","name":"bob"},{"role":"assistant","content":"y"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],"documents":[{"title":"t"}],
		"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true}`
	got, err := Parse(ChatCompletions, []byte(body), DefaultLimits())
	require.NoError(t, err)
	c := got.Chat
	assert.Len(t, c.Messages, 2)
	name, _ := c.Messages[0].Get("name")
	assert.Equal(t, "bob", name.Str())
	require.Len(t, c.Tools, 1)
	assert.Equal(t, `{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}`, string(c.Tools[0].AppendCompact(nil)), "key order kept")
	assert.Len(t, c.Documents, 1)
	thinking, ok := c.TemplateKwargs.Get("enable_thinking")
	assert.True(t, ok)
	assert.False(t, thinking.Bool())
	assert.False(t, c.AddGenerationPrompt)
	assert.True(t, c.ContinueFinalMessage)
}

func TestParseChatEmptyToolsIsNotAbsent(t *testing.T) {
	tests := []struct {
		name      string
		tools     string
		wantNil   bool
		wantCount int
	}{
		{name: "absent", tools: "", wantNil: true},
		{name: "null", tools: `,"tools":null`, wantNil: true},
		{name: "empty list", tools: `,"tools":[]`, wantNil: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user"}]`+tt.tools+`}`), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.wantNil, got.Chat.Tools == nil)
			assert.Len(t, got.Chat.Tools, tt.wantCount)
		})
	}
}

func TestParseRejects(t *testing.T) {
	deep := `{"model":"m","messages":[{"role":"user","content":"x","extra":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}]}`
	manyIDs := `{"model":"m","prompt":[` + strings.Repeat("1,", 10) + `1]}`
	tests := []struct {
		name     string
		endpoint Endpoint
		body     string
		param    string
		msg      string
	}{
		{"empty body", ChatCompletions, ``, "", "empty"},
		{"not JSON", ChatCompletions, `{"model":`, "", "not valid JSON"},
		{"not an object", ChatCompletions, `[]`, "", "must be a JSON object"},
		{"trailing data", ChatCompletions, `{"model":"m","messages":[{"role":"u"}]} x`, "", "not valid JSON"},
		{"no model", ChatCompletions, `{"messages":[{"role":"user"}]}`, "model", "'model' is required"},
		{"stream not a bool", ChatCompletions, `{"model":"m","stream":2,"messages":[{"role":"user"}]}`, "stream", "boolean"},
		{"stream a string that is no bool", ChatCompletions, `{"model":"m","stream":"maybe","messages":[{"role":"user"}]}`, "stream", "boolean"},
		{"max_tokens a string that is no int", Completions, `{"model":"m","max_tokens":"12a","prompt":"x"}`, "max_tokens", "non-negative integer"},
		{"max_tokens infinite", Completions, `{"model":"m","max_tokens":1e400,"prompt":"x"}`, "max_tokens", "non-negative integer"},
		{"negative max_tokens", Completions, `{"model":"m","max_tokens":-1,"prompt":"x"}`, "max_tokens", "non-negative"},
		{"fractional max_tokens", Completions, `{"model":"m","max_tokens":1.5,"prompt":"x"}`, "max_tokens", "non-negative integer"},
		{"no messages", ChatCompletions, `{"model":"m"}`, "messages", "required"},
		{"empty messages", ChatCompletions, `{"model":"m","messages":[]}`, "messages", "at least one"},
		{"message without role", ChatCompletions, `{"model":"m","messages":[{"content":"x"}]}`, "messages", "role"},
		{"content of the wrong type", ChatCompletions, `{"model":"m","messages":[{"role":"user","content":1}]}`, "messages", "content"},
		{"text part without text", ChatCompletions, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages", "'text'"},
		{"tool_calls not an array", ChatCompletions, `{"model":"m","messages":[{"role":"assistant","tool_calls":{}}]}`, "messages", "tool_calls"},
		{"tools not objects", ChatCompletions, `{"model":"m","messages":[{"role":"user"}],"tools":[1]}`, "tools", "array of objects"},
		{"kwargs not an object", ChatCompletions, `{"model":"m","messages":[{"role":"user"}],"chat_template_kwargs":[]}`, "chat_template_kwargs", "object"},
		{"both generation flags", ChatCompletions, `{"model":"m","messages":[{"role":"user"}],"continue_final_message":true}`, "continue_final_message", "cannot both"},
		{"nested deeper than the limit", ChatCompletions, deep, "", "deeper than 128 levels (max_json_depth)"},
		{"no prompt", Completions, `{"model":"m"}`, "prompt", "required"},
		{"empty prompt array", Completions, `{"model":"m","prompt":[]}`, "prompt", "empty array"},
		{"prompt of objects", Completions, `{"model":"m","prompt":[{}]}`, "prompt", "must be a string"},
		{"token id out of range", Completions, `{"model":"m","prompt":[4294967296]}`, "prompt", "[0, 2^32)"},
		{"negative token id", Completions, `{"model":"m","prompt":[[1,-2]]}`, "prompt", "[0, 2^32)"},
		{"more ids than max_prompt_tokens", Completions, manyIDs, "prompt", "more than 8 token ids (max_prompt_tokens)"},
		{"empty id batch", Completions, `{"model":"m","prompt":[[]]}`, "prompt", "must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := DefaultLimits()
			lim.MaxPromptTokens = 8
			_, err := Parse(tt.endpoint, []byte(tt.body), lim)
			require.Error(t, err)
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.True(t, errors.Is(err, ErrBadRequest))
			assert.Equal(t, tt.param, fe.Param)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestParseMemoryIsProportionalToTheBody(t *testing.T) {
	// A million token ids inside the default 4 MiB body cap: decoded straight into
	// []uint32 (4 MB), not into a value per element.
	body := []byte(`{"model":"m","prompt":[` + strings.Repeat("7,", 1<<20-1) + `7]}`)
	allocs := testing.AllocsPerRun(3, func() {
		got, err := Parse(Completions, body, DefaultLimits())
		if err != nil || len(got.Tokens) != 1<<20 {
			t.Fatalf("%d ids, %v", len(got.Tokens), err)
		}
	})
	assert.Less(t, allocs, 64.0, "a slice grown by appending, not an allocation per id")
}

func TestParseAddSpecialTokens(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name     string
		endpoint Endpoint
		body     string
		want     *bool
	}{
		{"completions absent", Completions, `{"model":"m","prompt":"x"}`, nil},
		{"completions null", Completions, `{"model":"m","prompt":"x","add_special_tokens":null}`, nil},
		{"completions false", Completions, `{"model":"m","prompt":"x","add_special_tokens":false}`, &no},
		{"chat true", ChatCompletions, `{"model":"m","messages":[{"role":"user"}],"add_special_tokens":true}`, &yes},
		{"a later duplicate wins", ChatCompletions, `{"model":"m","add_special_tokens":true,"messages":[{"role":"user"}],"add_special_tokens":false}`, &no},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.endpoint, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.AddSpecialTokens)
		})
	}
	_, err := Parse(Completions, []byte(`{"model":"m","prompt":"x","add_special_tokens":"nope"}`), DefaultLimits())
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "add_special_tokens", fe.Param)
}

// TestParseStringContentParts: vLLM's content part union includes plain strings, read
// as text parts, so a chat whose content array holds them is not refused.
func TestParseStringContentParts(t *testing.T) {
	got, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user","content":["a",{"type":"text","text":"b"}]}]}`), DefaultLimits())
	require.NoError(t, err)
	text, err := tokenize.ChatML{}.Render(got.Chat)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n", text)
}

func TestParseTruncatePromptTokens(t *testing.T) {
	got, err := Parse(Completions, []byte(`{"model":"m","prompt":"x","truncate_prompt_tokens":128}`), DefaultLimits())
	require.NoError(t, err)
	require.NotNil(t, got.TruncatePromptTokens)
	assert.Equal(t, int64(128), *got.TruncatePromptTokens)
	got, err = Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"user"}],"truncate_prompt_tokens":-1}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, int64(-1), *got.TruncatePromptTokens)
	for _, bad := range []string{`-2`, `1.5`, `"3.5"`, `"-2"`, `{}`} {
		_, err := Parse(Completions, []byte(`{"model":"m","prompt":"x","truncate_prompt_tokens":`+bad+`}`), DefaultLimits())
		var fe *FieldError
		require.ErrorAs(t, err, &fe, bad)
		assert.Equal(t, "truncate_prompt_tokens", fe.Param)
	}
}

// TestParseMaxTokens: the output bound vLLM checks against its context beside the
// prompt: a chat's max_completion_tokens when given, else its max_tokens; a
// completions request's max_tokens (it has no max_completion_tokens), 16 when absent as
// in vLLM; 0 without one.
func TestParseMaxTokens(t *testing.T) {
	tests := []struct {
		endpoint Endpoint
		fields   string
		want     int64
	}{
		{ChatCompletions, ``, 0},
		{ChatCompletions, `,"max_tokens":100`, 100},
		{ChatCompletions, `,"max_completion_tokens":200`, 200},
		{ChatCompletions, `,"max_tokens":100,"max_completion_tokens":200`, 200},
		{ChatCompletions, `,"max_tokens":100,"max_completion_tokens":null`, 100},
		{ChatCompletions, `,"max_tokens":100.0`, 100},
		{ChatCompletions, `,"max_tokens":"100"`, 100},
		{ChatCompletions, `,"max_tokens":99999999999999999999999`, math.MaxInt64},
		{Completions, `,"max_tokens":16`, 16},
		{Completions, `,"max_tokens":100`, 100},
		{Completions, ``, 16},                             // vLLM's default
		{Completions, `,"max_completion_tokens":200`, 16}, // not a completions field
		{Completions, `,"max_tokens":null`, 0},            // no bound: the engine fits it
		{Completions, `,"max_tokens":0`, 0},
	}
	for _, tt := range tests {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]` + tt.fields + `}`
		if tt.endpoint == Completions {
			body = `{"model":"m","prompt":"hi"` + tt.fields + `}`
		}
		got, err := Parse(tt.endpoint, []byte(body), DefaultLimits())
		require.NoError(t, err, body)
		assert.Equal(t, tt.want, got.MaxTokens, body)
	}
}

// TestParseModelReadsTheModelAlone: a body routed by load alone is read for its model
// and its syntax, and nothing else is judged.
func TestParseModelReadsTheModelAlone(t *testing.T) {
	lim := DefaultLimits()
	tests := []struct {
		name, body, want, wantErr string
	}{
		{"a chat", `{"messages":[{"role":"user","content":"x"}],"model":"m"}`, "m", ""},
		{"fields Parse would refuse are not read", `{"model":"m","messages":7,"max_tokens":-1}`, "m", ""},
		{"the last model counts", `{"model":"a","model":"b","prompt":"x"}`, "b", ""},
		{"no model", `{"prompt":"x"}`, "", "'model' is required"},
		{"a model that is no string", `{"model":["m"]}`, "", "'model' is required"},
		{"not JSON", `{"model":"m"`, "", "invalid JSON"},
		{"not an object", `["m"]`, "", "must be a JSON object"},
		{"empty", ``, "", "request body is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseModel([]byte(tt.body), lim)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.ErrorIs(t, err, ErrBadRequest)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
