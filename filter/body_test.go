package filter

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBody(t *testing.T) {
	tests := []struct {
		name    string
		kind    endpoint
		body    string
		prompt  string
		tokens  []uint32
		content string
		stream  bool
		salt    string
	}{
		{name: "chat with text parts joined by newlines", kind: chatCompletions,
			body:    `{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`,
			content: "a\nb", stream: true},
		{name: "assistant tool call without content", kind: chatCompletions,
			body:    `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
			content: `[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]`},
		{name: "completions string", kind: completions, body: `{"model":"m","prompt":"hi","cache_salt":"tenant-a"}`, prompt: "hi", salt: "tenant-a"},
		{name: "completions batch routes by the first prompt", kind: completions, body: `{"model":"m","prompt":["first","second"]}`, prompt: "first"},
		{name: "completions token ids", kind: completions, body: `{"model":"m","prompt":[1,2,3]}`, tokens: []uint32{1, 2, 3}},
		{name: "completions batch of token ids", kind: completions, body: `{"model":"m","prompt":[[4,5],[6]]}`, tokens: []uint32{4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseBody(tt.kind, []byte(tt.body))
			require.NoError(t, err)
			assert.Equal(t, "m", got.request.Model)
			assert.Equal(t, tt.stream, got.stream)
			assert.Equal(t, tt.prompt, got.request.Prompt)
			assert.Equal(t, tt.tokens, got.request.Tokens)
			assert.Equal(t, tt.salt, got.request.CacheSalt)
			if tt.content != "" {
				assert.Equal(t, tt.content, got.request.Messages[0].Content)
			}
		})
	}
}

func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":[[1],[2]]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":1}`, `[]`, `{`, `{"model":"m","prompt":[4294967296]}`, `{"model":"m","max_tokens":-1,"prompt":"x"}`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		kind := completions
		if chat {
			kind = chatCompletions
		}
		got, err := parseBody(kind, []byte(body))
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error is not a bad request: %v", err)
			}
			if toAPIError(err).status != 400 {
				t.Fatalf("parse error maps to %d", toAPIError(err).status)
			}
			return
		}
		if got.request.Model == "" {
			t.Fatal("accepted a body without a model")
		}
		if chat && len(got.request.Messages) == 0 {
			t.Fatal("accepted a chat without messages")
		}
		if !chat && got.request.Prompt == "" && len(got.request.Tokens) == 0 {
			// An empty string prompt is valid OpenAI input.
			if body == "" {
				t.Fatal("accepted an empty body")
			}
		}
	})
}
