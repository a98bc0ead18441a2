package openai

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/hf"
	"github.com/kvroute/kvroute/tokenize/template"
)

// byteTokenizer encodes text a byte an id, but for its added tokens (ids 256 on), as a
// tokenizer whose vocabulary has the template's special tokens does: enough for the
// probe, which looks at where ids change and whether a segment holds an added token.
type byteTokenizer struct{ added []string }

func (b byteTokenizer) Encode(text string, _ bool) ([]uint32, error) {
	var ids []uint32
next:
	for len(text) > 0 {
		for i, tok := range b.added {
			if strings.HasPrefix(text, tok) {
				ids = append(ids, uint32(256+i))
				text = text[len(tok):]
				continue next
			}
		}
		ids = append(ids, uint32(text[0]))
		text = text[1:]
	}
	return ids, nil
}

func (b byteTokenizer) IsAddedToken(id uint32) bool { return id >= 256 }

// probeRender renders and encodes a probe chat with r and tok.
func probeRender(r tokenize.ChatRenderer, tok tokenize.Tokenizer) ProbeRender {
	return func(chat *tokenize.Chat) (string, []uint32, bool) {
		text, err := r.Render(chat)
		if err != nil {
			return "", nil, false
		}
		ids, err := tok.Encode(text, false)
		return text, ids, err == nil
	}
}

// TestProbeInlineSystemOfEmbeddedTemplates pins the mode vLLM's probe picks for the
// templates kvroute embeds or renders directly:
//
//   - Qwen3 (its template and tokenizer): preserve. Its template renders a system
//     message that is not the first as "<|im_start|>system\n…<|im_end|>\n" where it
//     is (the tools stay in the first system message), <|im_start|> is an added token,
//     and a system message is no query: the reasoning of the assistant turns after the
//     last user query is kept with or without it.
//   - ChatML (kvroute's file-free renderer, with a tokenizer whose added tokens are
//     <|im_start|> and <|im_end|>): preserve, for the same reasons (it renders neither
//     tools nor reasoning). With the approximate tokenizer, which has no added tokens,
//     fold ("no role marker").
//   - Llama 3.1 and 3.2 (Llama-3.1-8B-Instruct's, Llama-3.3-70B-Instruct's,
//     Llama-3.2-3B-Instruct's templates): preserve. The system prompt and the date are
//     taken from the first message only; a later system message renders as its own
//     "<|start_header_id|>system<|end_header_id|>\n\n…<|eot_id|>" turn, and the
//     templates render no reasoning.
//   - Llama 3 (Meta-Llama-3-8B-Instruct's): preserve, the same turn layout for every
//     role.
func TestProbeInlineSystemOfEmbeddedTemplates(t *testing.T) {
	qwen3Tok, err := hf.LoadBuiltin("qwen3")
	require.NoError(t, err)
	llamaTokens := template.Tokens{Named: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}}
	llamaAdded := byteTokenizer{added: []string{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"}}
	clock := template.Options{Now: func() time.Time { return time.Date(2026, 3, 5, 12, 0, 0, 0, time.UTC) }}
	llama := func(model string) tokenize.ChatRenderer {
		r, err := template.New(templatecorpus.Ollama(t, model), llamaTokens, clock)
		require.NoError(t, err)
		return r
	}
	tests := []struct {
		name     string
		renderer tokenize.ChatRenderer
		tok      tokenize.Tokenizer
		want     InlineSystemMode
		reason   string
	}{
		{"qwen3", qwen3Renderer(t), qwen3Tok, InlineSystemPreserve, "the renderer marks them as distinct system turns"},
		{"chatml", tokenize.ChatML{}, byteTokenizer{added: []string{"<|im_start|>", "<|im_end|>"}}, InlineSystemPreserve, "the renderer marks them as distinct system turns"},
		{"chatml, approximate tokenizer", tokenize.ChatML{}, tokenize.Approx{}, InlineSystemFold, "mid: it has no role marker (reasoning_effort=high)"},
		{"llama 3.1", llama("library/llama3.1:8b"), llamaAdded, InlineSystemPreserve, "the renderer marks them as distinct system turns"},
		{"llama 3.2", llama("library/llama3.2:3b"), llamaAdded, InlineSystemPreserve, "the renderer marks them as distinct system turns"},
		{"llama 3", llama("library/llama3:8b"), llamaAdded, InlineSystemPreserve, "the renderer marks them as distinct system turns"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var isAdded func(uint32) bool
			if a, ok := tt.tok.(tokenize.AddedTokens); ok {
				isAdded = a.IsAddedToken
			}
			mode, reason := ProbeInlineSystem(probeRender(tt.renderer, tt.tok), isAdded)
			assert.Equal(t, tt.want, mode, reason)
			assert.Equal(t, tt.reason, reason)
		})
	}
}

// probeTemplate is a renderer of a Jinja template source with ChatML's tokens.
func probeTemplate(t *testing.T, src string) tokenize.ChatRenderer {
	r, err := template.New(src, template.Tokens{}, template.Options{})
	require.NoError(t, err)
	return r
}

// TestProbeInlineSystemFoldsWhatIsUnsafe pins each of the probe's checks with a
// template that fails it.
func TestProbeInlineSystemFoldsWhatIsUnsafe(t *testing.T) {
	chatml := byteTokenizer{added: []string{"<|im_start|>", "<|im_end|>"}}
	const turn = `<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n`
	const gen = `{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}`
	tests := []struct {
		name, src, reason string
	}{
		{"system messages hoisted to the front, counted",
			`{% set ns = namespace(n=0) %}{% for m in messages if m.role == "system" %}{% set ns.n = ns.n + 1 %}{% endfor %}` +
				`<|im_start|>system\n{{ ns.n }}{% for m in messages if m.role == "system" %} {{ m.content }}{% endfor %}<|im_end|>\n` +
				`{% for m in messages if m.role != "system" %}` + turn + `{% endfor %}` + gen,
			"mid: rendering it changes other parts of the prompt (reasoning_effort=high)"},
		{"system messages dropped after the first",
			`{% for m in messages %}{% if m.role != "system" or loop.first %}` + turn + `{% endif %}{% endfor %}` + gen,
			"mid: renderer drops it (reasoning_effort=high)"},
		{"system messages rendered as user turns",
			`{% for m in messages %}{% if m.role == "system" and not loop.first %}<|im_start|>user\n{{ m.content }}<|im_end|>\n{% else %}` + turn + `{% endif %}{% endfor %}` + gen,
			"mid: it renders the same as a user message (reasoning_effort=high)"},
		{"system messages without a marker",
			`{% for m in messages %}{% if m.role == "system" and not loop.first %}{{ m.content }}\n{% else %}` + turn + `{% endif %}{% endfor %}` + gen,
			"mid: it has no role marker (reasoning_effort=high)"},
		{"system messages refused after the first",
			`{% for m in messages %}{% if m.role == "system" and not loop.first %}{{ raise_exception("no") }}{% endif %}` + turn + `{% endfor %}` + gen,
			"mid: renderer rejects it (reasoning_effort=high)"},
		{"reasoning rendered with a later system message",
			`{% for m in messages %}{% if m.role == "system" and not loop.first %}<|im_start|>system\n{{ m.content }}` +
				`{% for x in messages if x.reasoning %} {{ x.reasoning }}{% endfor %}<|im_end|>\n{% else %}` + turn + `{% endif %}{% endfor %}` + gen,
			"after_tool: it changes which reasoning is kept (reasoning_effort=high)"},
		{"nothing renders",
			`{{ raise_exception("no") }}`,
			"the probe conversations could not be rendered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mode, reason := ProbeInlineSystem(probeRender(probeTemplate(t, tt.src), chatml), chatml.IsAddedToken)
			assert.Equal(t, InlineSystemFold, mode)
			assert.Equal(t, tt.reason, reason)
		})
	}
}
