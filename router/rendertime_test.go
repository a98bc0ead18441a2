package router

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

// TestChatTooSlowToRenderIsRoutedByLoad: granite4's template builds its system prompt
// by concatenating one document at a time, a copy of the whole text so far for each, so
// a 1 MiB body of 42,000 tiny documents (within max_body_bytes and the parser's and the
// renderer's value budgets) would cost over 30 s of CPU. The render stops at the
// renderer's default time budget and the request is routed by load, counted as an
// "error" fallback; a 200-turn chat renders exactly, and so does one with a few
// documents.
func TestChatTooSlowToRenderIsRoutedByLoad(t *testing.T) {
	r, err := template.New(templatecorpus.Ollama(t, "library/granite4:latest"), template.Tokens{}, template.Options{})
	require.NoError(t, err)
	encoder := tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: r}
	p := Prompter{BlockSize: 16, Tokenizers: byModel{"m": encoder}}
	parse := func(body string) *Request {
		t.Helper()
		parsed, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
		require.NoError(t, err)
		require.NoError(t, parsed.Chat.Unread)
		return &Request{Model: "m", Chat: parsed.Chat}
	}

	docs := strings.Repeat(`{"title":"t","text":"x"},`, 42000)
	hostile := parse(`{"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[` + strings.TrimSuffix(docs, ",") + `]}`)
	prompt, err := p.Prompt(context.Background(), hostile)
	require.NoError(t, err)
	assert.Equal(t, FallbackError, prompt.Fallback)
	require.ErrorIs(t, prompt.FallbackErr, template.ErrRenderTooSlow)

	reg := prometheus.NewRegistry()
	rt, _ := promptRouter(t, byModel{"m": encoder}, reg)
	d, err := rt.Route(context.Background(), hostile)
	require.NoError(t, err, "never failed")
	assert.Equal(t, FallbackError, d.PromptFallback)
	assert.Equal(t, "a", d.Worker)
	d.Release()
	assert.Equal(t, 1.0, testutil.ToFloat64(fallbacksOn(t, reg).fallbacks.WithLabelValues(FallbackError)))

	// A 200-turn chat: a system prompt, then 200 user turns and the 199 answers between.
	text := func(i int) string {
		return strings.Repeat(fmt.Sprintf("turn %d says something about the cache, ", i), 12)
	}
	msgs := []string{`{"role":"system","content":"You are a helpful assistant."}`}
	want := "<|start_of_role|>system<|end_of_role|>You are a helpful assistant.<|end_of_text|>\n"
	for i := range 399 {
		role := [2]string{"user", "assistant"}[i%2]
		msgs = append(msgs, `{"role":"`+role+`","content":"`+text(i)+`"}`)
		want += "<|start_of_role|>" + role + "<|end_of_role|>" + text(i) + "<|end_of_text|>\n"
	}
	want += "<|start_of_role|>assistant<|end_of_role|>"
	long := parse(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}`)
	prompt, err = p.Prompt(context.Background(), long)
	require.NoError(t, err)
	require.Empty(t, prompt.Fallback, "%v", prompt.FallbackErr)
	assert.Equal(t, want, prompt.Text)

	withDocs := parse(`{"model":"m","messages":[` + strings.Join(msgs, ",") + `],"documents":[` + strings.TrimSuffix(strings.Repeat(`{"title":"t","text":"x"},`, 20), ",") + `]}`)
	prompt, err = p.Prompt(context.Background(), withDocs)
	require.NoError(t, err)
	require.Empty(t, prompt.Fallback, "%v", prompt.FallbackErr)
	assert.Equal(t, 20, strings.Count(prompt.Text, `{"title": "t", "text": "x"}`))
}
