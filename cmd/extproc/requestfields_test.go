package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// The tests below hold `extproc tokenize` (openai.Parse, filter.RouteRequest and the
// router's Prompter, the router's own path) to what vLLM does with the request fields
// that change the prompt it serves: a field kvroute cannot reproduce routes the request
// by load rather than on ids the engine never computes, and a field vLLM refuses is
// refused. vLLM's behaviour is read from vllm/entrypoints/openai/chat_completion/protocol.py
// and completion/protocol.py at 002032ee2b18, and vllm/renderers/online_renderer.py at
// 01063cd07bef.

// TestARequestsOwnChatTemplateIsNotRenderedWithTheModels: vLLM renders a chat whose
// body names its own chat_template (top-level, or in chat_template_kwargs) with that
// template when the server trusts request templates (--trust-request-chat-template),
// and refuses it otherwise (online_renderer.py validate_chat_template). Either way the
// model's template is not the one: kvroute routes such a chat by load.
func TestARequestsOwnChatTemplateIsNotRenderedWithTheModels(t *testing.T) {
	plain, stderr, code := tokenizeCmd(t, `{"model":"q","messages":[{"role":"user","content":"Hi"}]}`)
	require.Equal(t, 0, code, stderr)
	require.NotEmpty(t, plain.TokenIDs)
	for _, body := range []string{
		`{"model":"q","messages":[{"role":"user","content":"Hi"}],"chat_template":"{{ messages[0].content }}"}`,
		`{"model":"q","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"chat_template":"{{ messages[0].content }}"}}`,
	} {
		out, stderr, code := tokenizeCmd(t, body)
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, router.FallbackUnsupported, out.Fallback, body)
		assert.Empty(t, out.TokenIDs, body)
	}
	for _, body := range []string{
		`{"model":"q","messages":[{"role":"user","content":"Hi"}],"chat_template":null}`,
		`{"model":"q","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"chat_template":null}}`,
	} {
		out, stderr, code := tokenizeCmd(t, body)
		require.Equal(t, 0, code, stderr)
		assert.Empty(t, out.Fallback, "null is no template: %s", body)
		assert.Equal(t, plain.TokenIDs, out.TokenIDs, body)
	}
	_, stderr, code = tokenizeCmd(t, `{"model":"q","messages":[{"role":"user","content":"Hi"}],"chat_template":7}`)
	assert.Equal(t, 1, code, "vLLM's chat_template is a str: %s", stderr)
}

// TestACompletionWithPromptEmbedsIsRoutedByLoad: vLLM serves a completions request
// whose prompt_embeds carry the prompt (with --enable-prompt-embeds), with or without a
// prompt; the embeddings are prompts of the batch, first ("embeds take higher
// priority", online_renderer.py preprocess_completion), and their ids are no
// tokenizer's. kvroute routes it by load, never refusing it for lacking a prompt. An
// empty list of embeddings is none (validate_prompt_and_prompt_embeds).
func TestACompletionWithPromptEmbedsIsRoutedByLoad(t *testing.T) {
	for _, body := range []string{
		`{"model":"q","prompt_embeds":"AAAA"}`,
		`{"model":"q","prompt":null,"prompt_embeds":["AAAA"]}`,
		`{"model":"q","prompt":"","prompt_embeds":"AAAA"}`,
		`{"model":"q","prompt":"Hello there","prompt_embeds":"AAAA"}`,
	} {
		out, stderr, code := tokenizeCmd(t, body, "-completions")
		require.Equal(t, 0, code, "%s: %s", body, stderr)
		assert.Equal(t, router.FallbackUnsupported, out.Fallback, body)
		assert.Empty(t, out.TokenIDs, body)
	}
	out, stderr, code := tokenizeCmd(t, `{"model":"q","prompt":"Hello there","prompt_embeds":[]}`, "-completions")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, out.Fallback)
	assert.NotEmpty(t, out.TokenIDs, "no embeddings: the prompt is the text's")
	for _, body := range []string{`{"model":"q"}`, `{"model":"q","prompt":null}`, `{"model":"q","prompt_embeds":[]}`} {
		_, _, code := tokenizeCmd(t, body, "-completions")
		assert.Equal(t, 1, code, "no prompt at all is refused, as vLLM refuses it: %s", body)
	}
}

// TestACompletionWithASuffixIsRoutedByLoad: vLLM refuses a completions request with a
// suffix ("suffix is not currently supported", online_renderer.py render_completion),
// and an engine that serves one (SGLang's fill-in-the-middle) wraps the prompt in a
// template of its own: either way the prompt text is not what the engine computes, so
// kvroute routes it by load instead of recording blocks no engine holds.
func TestACompletionWithASuffixIsRoutedByLoad(t *testing.T) {
	out, stderr, code := tokenizeCmd(t, `{"model":"q","prompt":"def f(","suffix":"return x"}`, "-completions")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, router.FallbackUnsupported, out.Fallback)
	assert.Empty(t, out.TokenIDs)

	out, stderr, code = tokenizeCmd(t, `{"model":"q","prompt":"def f(","suffix":null}`, "-completions")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, out.Fallback, "a null suffix is none")
	assert.NotEmpty(t, out.TokenIDs)
}

// TestAnEmptyCacheSaltIsRefused: vLLM refuses a cache_salt that is the empty string
// ("Parameter 'cache_salt' must be a non-empty string if provided."; the field's
// min_length=1), on every API it takes one. kvroute read it as no salt and routed the
// request on unsalted blocks.
func TestAnEmptyCacheSaltIsRefused(t *testing.T) {
	for _, tt := range []struct{ body, flag string }{
		{`{"model":"q","messages":[{"role":"user","content":"Hi"}],"cache_salt":""}`, ""},
		{`{"model":"q","prompt":"Hi","cache_salt":""}`, "-completions"},
		{`{"model":"q","input":"Hi","store":false,"cache_salt":""}`, "-responses"},
		{`{"model":"q","max_tokens":8,"messages":[{"role":"user","content":"Hi"}],"cache_salt":""}`, "-messages"},
	} {
		var args []string
		if tt.flag != "" {
			args = append(args, tt.flag)
		}
		_, stderr, code := tokenizeCmd(t, tt.body, args...)
		assert.Equal(t, 1, code, tt.body)
		assert.Contains(t, stderr, "cache_salt", tt.body)
	}
}
