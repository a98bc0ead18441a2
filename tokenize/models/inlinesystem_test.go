package models_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// inlineSystemBody is a Claude Code-like turn whose last message is an inline system
// message: preserve renders it as a system turn, fold appends it to the user's text.
const inlineSystemBody = `{"model":"m","max_tokens":100,"system":"Be brief.","messages":[` +
	`{"role":"user","content":"Fix the test."},{"role":"system","content":"<system-reminder>Note.</system-reminder>"}]}`

// TestInlineSystemModePerModel pins that each entry renders a Messages body's inline
// system messages in its mode: auto probes Qwen3's template once (preserve, logged at
// Info once, concurrent first requests included), and preserve and fold are the
// operator's word.
func TestInlineSystemModePerModel(t *testing.T) {
	var logs bytes.Buffer
	s, err := models.Load(models.Config{
		"auto":     {Builtin: "qwen3"},
		"preserve": {Builtin: "qwen3", MessagesInlineSystem: "preserve"},
		"fold":     {Builtin: "qwen3", MessagesInlineSystem: "fold"},
	}, models.Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	chat, err := openai.MessagesChat([]byte(inlineSystemBody), openai.DefaultLimits())
	require.NoError(t, err)
	require.NotNil(t, chat.Folded)

	const kept = "Fix the test.<|im_end|>\n<|im_start|>system\n<system-reminder>Note.</system-reminder><|im_end|>\n"
	const folded = "Fix the test.\n\n<system-reminder>Note.</system-reminder><|im_end|>\n"
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			enc, err := s.Model("auto").EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat})
			assert.NoError(t, err)
			assert.Contains(t, enc.Text, kept)
		})
	}
	wg.Wait()
	for model, want := range map[string]string{"preserve": kept, "fold": folded} {
		enc, err := s.Model(model).EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat})
		require.NoError(t, err)
		assert.Contains(t, enc.Text, want, model)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "Anthropic inline system messages will be"), logs.String())
	assert.Contains(t, logs.String(), `level=INFO msg="tokenizers: Anthropic inline system messages will be kept in place: the renderer marks them as distinct system turns" model=auto mode=preserve`)
}

// TestInlineSystemModeOfAnEngineEntry pins that a model whose engine renders its chats
// routes a body with inline system messages by load under auto (kvroute cannot probe
// the engine's template), and sends the chat of the mode set otherwise.
func TestInlineSystemModeOfAnEngineEntry(t *testing.T) {
	s, err := models.Load(models.Config{"e": {Engine: &engine.Config{URL: "http://127.0.0.1:1"}}}, models.Deps{})
	require.NoError(t, err)
	chat, err := openai.MessagesChat([]byte(inlineSystemBody), openai.DefaultLimits())
	require.NoError(t, err)
	_, err = s.Model("e").EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat})
	require.ErrorIs(t, err, tokenize.ErrUnsupported)
	assert.Contains(t, err.Error(), "messages_inline_system")
	_, err = s.Model("e").EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat.Folded})
	require.Error(t, err) // no engine listens
	assert.NotContains(t, err.Error(), "inline system", "a chat without Folded goes to the engine")
}

// TestAnEngineRendersAMessagesBodyWithInlineSystemMessages: a Messages body that comes
// along for its engine (BodyAPI messages) is posted to /v1/messages/render whatever
// messages_inline_system says: the engine places its system messages itself.
func TestAnEngineRendersAMessagesBodyWithInlineSystemMessages(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		_, _ = io.WriteString(w, `{"token_ids":[7,8,9]}`)
	}))
	t.Cleanup(srv.Close)
	s, err := models.Load(models.Config{"e": {Engine: &engine.Config{URL: srv.URL}}}, models.Deps{})
	require.NoError(t, err)
	chat, err := openai.MessagesChat([]byte(inlineSystemBody), openai.DefaultLimits())
	require.NoError(t, err)
	require.NotNil(t, chat.Folded)
	enc, err := s.Model("e").EncodePrompt(context.Background(), tokenize.Prompt{Chat: chat, Body: []byte(inlineSystemBody), BodyAPI: tokenize.APIMessages})
	require.NoError(t, err)
	assert.Equal(t, []uint32{7, 8, 9}, enc.IDs)
	assert.Equal(t, []string{engine.MessagesPath}, paths)
}

// TestInlineSystemModeIsValidated pins the option's values.
func TestInlineSystemModeIsValidated(t *testing.T) {
	err := models.Config{"m": {Builtin: "qwen3", MessagesInlineSystem: "hoist"}}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tokenizers.m.messages_inline_system")
	for _, v := range []string{"", "auto", "preserve", "fold"} {
		assert.NoError(t, models.Config{"m": {Builtin: "qwen3", MessagesInlineSystem: v}}.Validate(), v)
	}
}
