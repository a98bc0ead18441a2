package template

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// qwen3Pair returns Qwen3's renderer as loaded (with its direct renderer) and a copy
// that renders everything through the Jinja library.
func qwen3Pair(tb testing.TB) (direct, interpreted *Renderer) {
	tb.Helper()
	r, err := FromConfigFile(filepath.Join("testdata", "configs", "qwen3"), Options{})
	require.NoError(tb, err)
	require.NotNil(tb, r.templates[DefaultTemplate].direct, "Qwen3's template no longer matches its direct renderer's hash")
	only := *r
	only.templates = map[string]*compiled{}
	for name, c := range r.templates {
		plain := *c
		plain.direct = nil
		only.templates[name] = &plain
	}
	return r, &only
}

// sameRender renders chat both ways and fails unless the prompts, or the errors' texts,
// agree. It reports whether the direct renderer took the chat.
// renderBodies parses n request bodies from body and holds the direct renderer to the
// Jinja library on each that parses; it returns how many the direct renderer took and
// how many parsed.
func renderBodies(t *testing.T, direct, interpreted *Renderer, n int, body func() []byte) (took, parsed int) {
	t.Helper()
	for range n {
		b := body()
		req, err := openai.Parse(openai.ChatCompletions, b, openai.DefaultLimits())
		if err != nil {
			continue
		}
		parsed++
		if sameRender(t, direct, interpreted, req.Chat, string(b)) {
			took++
		}
	}
	return took, parsed
}

// renderInvalidTextChats holds the direct renderer to the Jinja library on n text chats
// built in Go, with roles from roles and texts made of fragments (invalid UTF-8 among
// them, which the request parser refuses but a renderer may be handed); the direct
// renderer must take every one.
func renderInvalidTextChats(t *testing.T, direct, interpreted *Renderer, rng *rand.Rand, n int, fragments, roles []string) {
	t.Helper()
	for range n {
		var roleContent []string
		for range 1 + rng.IntN(5) {
			var b strings.Builder
			for range rng.IntN(6) {
				b.WriteString(fragments[rng.IntN(len(fragments))])
			}
			roleContent = append(roleContent, roles[rng.IntN(len(roles))], b.String())
		}
		chat := tokenize.TextChat(roleContent...)
		chat.AddGenerationPrompt = rng.IntN(2) == 0
		chat.ContinueFinalMessage = !chat.AddGenerationPrompt && rng.IntN(2) == 0
		require.True(t, sameRender(t, direct, interpreted, chat, strings.Join(roleContent, " | ")), "the direct renderer declined a text chat")
	}
}

func sameRender(t *testing.T, direct, interpreted *Renderer, chat *tokenize.Chat, what string) bool {
	t.Helper()
	want, wantErr := interpreted.Render(chat)
	got, gotErr := direct.Render(chat)
	if (wantErr == nil) != (gotErr == nil) || wantErr == nil && got != want || wantErr != nil && wantErr.Error() != gotErr.Error() {
		t.Fatalf("%s:\ndirect %q (%v)\nJinja  %q (%v)", what, got, gotErr, want, wantErr)
	}
	// AppendRender appends the same prompt after what the buffer holds, both ways, and
	// leaves that alone (the buffer has spare capacity, which a direct render that then
	// declines may have written to).
	for _, r := range []*Renderer{direct, interpreted} {
		buf := append(make([]byte, 0, 64), "kept:"...)
		out, err := r.AppendRender(buf, chat)
		if (err == nil) != (gotErr == nil) || err == nil && string(out) != "kept:"+got || string(buf) != "kept:" {
			t.Fatalf("%s: AppendRender gives %q (%v) after %q, Render %q (%v)", what, out, err, buf, got, gotErr)
		}
	}
	_, _, took := direct.templates[DefaultTemplate].direct(nil, chat)
	return took
}

// committedChats are the request bodies of testdata/chats, by file name.
func committedChats(tb testing.TB) map[string][]byte {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "chats", "*.json"))
	require.NoError(tb, err)
	require.NotEmpty(tb, files)
	bodies := make(map[string][]byte, len(files))
	for _, file := range files {
		body, err := os.ReadFile(file)
		require.NoError(tb, err)
		bodies[filepath.Base(file)] = body
	}
	return bodies
}

// qwen3Fragments build message texts that reach every branch of Qwen3's template:
// reasoning tags (several, unclosed, surrounded by newlines), tool-response wrappers,
// newline runs, non-ASCII text and the empty string.
var qwen3Fragments = []string{"", "Hello", " world", "\n", "\n\n", "<think>", "</think>", "<think>\nplan\n</think>\n\nanswer",
	"<tool_response>", "</tool_response>", "{\"temp\": 21}", "héllo 🙂", "<|im_end|>", "  ", "x\ny"}

// randomQwen3Body is a chat request of 1–8 messages with random roles and texts drawn
// from qwen3Fragments, and random generation-prompt, continuation and kwargs settings.
func randomQwen3Body(rng *rand.Rand) []byte {
	roles := []string{"system", "user", "assistant", "tool", "user", "assistant"}
	n := 1 + rng.IntN(8)
	msgs := make([]map[string]any, n)
	for i := range msgs {
		text := ""
		for range rng.IntN(4) {
			text += qwen3Fragments[rng.IntN(len(qwen3Fragments))]
		}
		msgs[i] = map[string]any{"role": roles[rng.IntN(len(roles))], "content": text}
		if rng.IntN(12) == 0 {
			msgs[i]["name"] = "someone"
		}
	}
	body := map[string]any{"model": "qwen3", "messages": msgs}
	switch rng.IntN(4) {
	case 0:
		body["add_generation_prompt"] = false
	case 1:
		body["add_generation_prompt"] = false
		body["continue_final_message"] = true
	}
	switch rng.IntN(5) {
	case 0:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
	case 1:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
	case 2:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": 0}
	}
	out, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return out
}

// TestQwen3DirectRendererMatchesJinja renders the committed chats and 3,000 random ones
// with Qwen3's direct renderer and through the Jinja library: every prompt and every
// error must agree, and the direct renderer must have taken most random chats.
func TestQwen3DirectRendererMatchesJinja(t *testing.T) {
	direct, interpreted := qwen3Pair(t)
	files := committedChats(t)
	tookFiles := 0
	for file, body := range files {
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		require.NoError(t, err, file)
		if sameRender(t, direct, interpreted, req.Chat, file) {
			tookFiles++
		}
	}
	rng := rand.New(rand.NewPCG(9, 9))
	took, parsed := 0, 0
	for range 3000 {
		body := randomQwen3Body(rng)
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		if err != nil {
			continue
		}
		parsed++
		if sameRender(t, direct, interpreted, req.Chat, string(body)) {
			took++
		}
	}
	t.Logf("direct renderer took %d of %d committed chats and %d of %d random ones", tookFiles, len(files), took, parsed)
	require.GreaterOrEqual(t, tookFiles, 5)
	require.Greater(t, took, parsed*3/4)
}

// FuzzQwen3Direct parses request bodies and holds Qwen3's direct renderer to the Jinja
// library on every chat it takes.
func FuzzQwen3Direct(f *testing.F) {
	for _, body := range committedChats(f) {
		f.Add(body)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	for range 20 {
		f.Add(randomQwen3Body(rng))
	}
	direct, interpreted := qwen3Pair(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		if err != nil || req.Chat == nil {
			return
		}
		sameRender(t, direct, interpreted, req.Chat, string(body))
	})
}

// TestQwen3ReasoningContentIsReasoning: an assistant message's reasoning_content, the
// name vLLM still accepts for reasoning, renders Qwen3's think block as reasoning does,
// through the direct renderer and the library alike.
func TestQwen3ReasoningContentIsReasoning(t *testing.T) {
	direct, interpreted := qwen3Pair(t)
	const head = `{"model":"m","add_generation_prompt":false,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a",`
	parse := func(body string) *tokenize.Chat {
		req, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
		require.NoError(t, err)
		return req.Chat
	}
	want, err := interpreted.Render(parse(head + `"reasoning":"r"}]}`))
	require.NoError(t, err)
	require.Contains(t, want, "<think>\nr\n</think>")
	for name, r := range map[string]*Renderer{"direct": direct, "library": interpreted} {
		got, err := r.Render(parse(head + `"reasoning_content":"r"}]}`))
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
}
