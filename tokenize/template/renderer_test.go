package template_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

// chatOf parses an OpenAI request body into the chat the router hands the renderer.
func chatOf(t *testing.T, body string) *tokenize.Chat {
	t.Helper()
	req, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
	require.NoError(t, err)
	return req.Chat
}

func newRenderer(t *testing.T, src string, opts template.Options) *template.Renderer {
	t.Helper()
	r, err := template.New(src, template.Tokens{Named: map[string]string{"bos_token": "<s>", "eos_token": "</s>"}}, opts)
	require.NoError(t, err)
	return r
}

func TestRenderPreparesMessagesAsVLLM(t *testing.T) {
	const dump = `{{ messages | tojson }}`
	tests := []struct {
		name string
		src  string
		body string
		want string
	}{
		{
			name: "unknown message keys are dropped, known ones reordered",
			src:  dump,
			body: `{"model":"m","messages":[{"name":"ana","extra":1,"content":"hi","role":"user"}]}`,
			want: `[{"role": "user", "content": "hi", "name": "ana"}]`,
		},
		{
			name: "null content is an empty string",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":null}]}`,
			want: `[{"role": "assistant", "content": ""}]`,
		},
		{
			name: "text parts joined with a newline",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"b"}]}]}`,
			want: `[{"role": "user", "content": "a\nb"}]`,
		},
		{
			name: "tool call arguments parsed, keys in request order; bad JSON becomes {}",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"type":"function","id":"c","function":{"arguments":"{\"z\":1,\"a\":[true,null]}","name":"f"}},{"id":"d","function":{"name":"g","arguments":"{"}}]}]}`,
			want: `[{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c", "function": {"arguments": {"z": 1, "a": [true, null]}, "name": "f"}}, {"id": "d", "function": {"name": "g", "arguments": {}}}]}]`,
		},
		{
			name: "empty tool_calls dropped",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[]}]}`,
			want: `[{"role": "assistant", "content": "x"}]`,
		},
		{
			name: "reasoning copied to reasoning_content",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"x","reasoning":"r"}]}`,
			want: `[{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}]`,
		},
		{
			name: "reasoning_content read as reasoning (vLLM renames it before validation)",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"x","reasoning_content":"r"}]}`,
			want: `[{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}]`,
		},
		{
			name: "reasoning wins over reasoning_content",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"x","reasoning_content":"old","reasoning":"r"}]}`,
			want: `[{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}]`,
		},
		{
			name: "reasoning_content used when reasoning is null",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"assistant","content":"x","reasoning":null,"reasoning_content":"r"}]}`,
			want: `[{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}]`,
		},
		{
			name: "tool message keeps tool_call_id",
			src:  dump,
			body: `{"model":"m","messages":[{"role":"tool","content":"42","tool_call_id":"c1"}]}`,
			want: `[{"role": "tool", "content": "42", "tool_call_id": "c1"}]`,
		},
		{
			name: "openai content format keeps parts when the template loops over content",
			src:  `{% for m in messages %}{% for p in m.content %}{{ p | tojson }}{% endfor %}{% endfor %}`,
			body: `{"model":"m","messages":[{"role":"user","content":"plain"},{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
			want: `{"type": "text", "text": "plain"}{"type": "text", "text": "a"}`,
		},
		{
			name: "tools shaped as pydantic dumps them",
			src:  `{{ tools | tojson }}`,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"function":{"parameters":{"b":1,"a":2},"strict":true,"name":"f"}}]}`,
			want: `[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "a": 2}, "strict": true}}]`,
		},
		{
			name: "special tokens, documents and numbers as Python prints them",
			src:  `{{ bos_token }}{{ documents | tojson }}{{ documents[0].n }} {{ documents[0].f }}{{ eos_token }}`,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"documents":[{"n":7,"f":1.0}]}`,
			want: `<s>[{"n": 7, "f": 1.0}]7 1.0</s>`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newRenderer(t, tt.src, template.Options{}).Render(chatOf(t, tt.body))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRenderKwargs(t *testing.T) {
	const src = `{{ add_generation_prompt }} {{ enable_thinking | default('unset') }} {{ bos_token }} {{ tools is none }}`
	tests := []struct {
		name    string
		kwargs  string
		want    string
		wantErr string
	}{
		{name: "none", kwargs: ``, want: `True unset <s> True`},
		{name: "template variable", kwargs: `{"enable_thinking":false}`, want: `True False <s> True`},
		{name: "the request's add_generation_prompt wins over the kwargs'", kwargs: `{"add_generation_prompt":false}`, want: `True unset <s> True`},
		{name: "a null kwarg is dropped", kwargs: `{"bos_token":null,"enable_thinking":null}`, want: `True unset <s> True`},
		{name: "an \"auto\" kwarg is dropped", kwargs: `{"enable_thinking":"auto","tools":"auto"}`, want: `True unset <s> True`},
		{name: "a null tools kwarg leaves the tools alone", kwargs: `{"tools":null}`, want: `True unset <s> True`},
		{name: "a null chat_template is dropped, not refused", kwargs: `{"chat_template":null,"tokenize":null,"messages":null}`, want: `True unset <s> True`},
		{name: "overrides a special token", kwargs: `{"bos_token":"<B>"}`, want: `True unset <B> True`},
		{name: "overrides tools", kwargs: `{"tools":[]}`, want: `True unset <s> False`},
		{name: "transformers parameters are not template variables", kwargs: `{"padding":true}`, want: `True unset <s> True`},
		{name: "chat_template refused", kwargs: `{"chat_template":"x"}`, wantErr: "chat_template"},
		{name: "messages refused", kwargs: `{"messages":[]}`, wantErr: "messages"},
		{name: "the request's continue_final_message wins over the kwargs'", kwargs: `{"continue_final_message":true}`, want: `True unset <s> True`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"user","content":"x"}]`
			if tt.kwargs != "" {
				body += `,"chat_template_kwargs":` + tt.kwargs
			}
			chat := chatOf(t, body+`}`)
			// openai.Parse marks a chat naming its own template as one not to render
			// (Unread); the renderer refuses it on its own too, for a chat built
			// otherwise (a Responses API body's kwargs).
			chat.Unread = nil
			got, err := newRenderer(t, src, template.Options{}).Render(chat)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, template.ErrRender)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRenderContinueFinalMessage(t *testing.T) {
	const src = `{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}`
	tests := []struct {
		name, last, want string
	}{
		{name: "cut after the final text", last: "Sure: red", want: "<user>q</user><assistant>Sure: red"},
		{name: "trailing space the template trimmed is dropped", last: "Sure: red  ", want: "<user>q</user><assistant>Sure: red"},
		{name: "empty final message keeps everything", last: "", want: "<user>q</user><assistant></assistant>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","add_generation_prompt":false,"continue_final_message":true,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"` + tt.last + `"}]}`
			got, err := newRenderer(t, src, template.Options{}).Render(chatOf(t, body))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	t.Run("final text the template drops", func(t *testing.T) {
		body := `{"model":"m","add_generation_prompt":false,"continue_final_message":true,"messages":[{"role":"assistant","content":"gone"}]}`
		_, err := newRenderer(t, `x`, template.Options{}).Render(chatOf(t, body))
		require.ErrorIs(t, err, template.ErrRender)
	})
}

func TestRenderErrors(t *testing.T) {
	user := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	tests := []struct {
		name    string
		src     string
		opts    template.Options
		body    string
		want    error
		wantMsg string
	}{
		{name: "raise_exception", src: `{{ raise_exception('roles must alternate') }}`, body: user, want: template.ErrTemplate, wantMsg: "roles must alternate"},
		{name: "raise_exception inside a macro", src: `{% macro m() %}{{ raise_exception('deep') }}{% endmacro %}{{ m() }}`, body: user, want: template.ErrTemplate, wantMsg: "deep"},
		{name: "image part", src: `x`, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, want: template.ErrUnsupportedContent},
		{name: "part without type", src: `x`, body: `{"model":"m","messages":[{"role":"user","content":[{"image_url":"u"}]}]}`, want: template.ErrUnsupportedContent},
		{name: "unknown part type", src: `x`, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"hologram"}]}]}`, want: template.ErrRender},
		{name: "tool call without function", src: `x`, body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c"}]}]}`, want: template.ErrRender},
		{name: "output over the cap", src: `{% for i in range(100) %}0123456789{% endfor %}`, opts: template.Options{MaxOutputBytes: 999}, body: user, want: template.ErrOutputTooLarge},
		{name: "huge range refused", src: `{{ range(100000000) | length }}`, body: user, want: template.ErrRender, wantMsg: "exceeds"},
		{name: "range of a string refused", src: `{{ range('9') }}`, body: user, want: template.ErrRender},
		{name: "undefined call", src: `{{ nope() }}`, body: user, want: template.ErrRender},
		{name: "strftime_now without a format", src: `{{ strftime_now() }}`, body: user, want: template.ErrRender},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newRenderer(t, tt.src, tt.opts).Render(chatOf(t, tt.body))
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.wantMsg)
		})
	}
	t.Run("no messages", func(t *testing.T) {
		_, err := newRenderer(t, `x`, template.Options{}).Render(&tokenize.Chat{})
		assert.ErrorIs(t, err, tokenize.ErrNoMessages)
		_, err = newRenderer(t, `x`, template.Options{}).Render(nil)
		assert.ErrorIs(t, err, tokenize.ErrNoMessages)
	})
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name string
		src  string
		opts template.Options
	}{
		{name: "syntax error", src: `{% if %}`},
		{name: "unclosed tag", src: `{{ messages`},
		{name: "unclosed comment", src: `{# x`},
		{name: "unknown content format", src: `x`, opts: template.Options{ContentFormat: "xml"}},
		{name: "negative output cap", src: `x`, opts: template.Options{MaxOutputBytes: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := template.New(tt.src, template.Tokens{}, tt.opts)
			assert.Error(t, err)
		})
	}
	_, err := template.NewNamed(map[string]string{"tool_use": "x"}, template.Tokens{}, template.Options{})
	assert.ErrorContains(t, err, `no "default"`)
}

func TestStrftimeNowUsesTheInjectedClock(t *testing.T) {
	at := time.Date(2024, 2, 9, 7, 3, 4, 0, time.UTC)
	r := newRenderer(t, `{{ strftime_now('%d %b %Y|%-d %B|%A %a|%H:%M:%S %I%p|%j|%y|%e|%%|%Q') }}`, template.Options{Now: func() time.Time { return at }})
	got, err := r.Render(tokenize.TextChat("user", "x"))
	require.NoError(t, err)
	assert.Equal(t, "09 Feb 2024|9 February|Friday Fri|07:03:04 07AM|040|24| 9|%|%Q", got)
}

func TestRenderIsSafeForConcurrentUse(t *testing.T) {
	r := newRenderer(t, `{% for m in messages %}{% set m2 = m %}{{ m2.role }}:{{ m2.content }}{% endfor %}{{ messages | tojson }}`, template.Options{})
	chat := chatOf(t, `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`)
	want, err := r.Render(chat)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				got, err := r.Render(chat)
				if err == nil && got != want {
					err = errors.New("different output: " + got)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestDetectContentFormat(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want template.ContentFormat
	}{
		{name: "plain", src: `{% for m in messages %}{{ m.content }}{% endfor %}`, want: template.ContentString},
		{name: "loop over content", src: `{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}`, want: template.ContentOpenAI},
		{name: "attribute access", src: `{%- for m in messages -%}{%- for c in m.content | selectattr('type') -%}{%- endfor -%}{%- endfor -%}`, want: template.ContentOpenAI},
		{name: "through an assigned slice", src: `{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, want: template.ContentOpenAI},
		{name: "through a filtered list", src: `{% set ms = messages | list %}{% set ms2 = ms %}{% for m in ms2 if m.role %}{% for c in m['content'][1:] %}{% endfor %}{% endfor %}`, want: template.ContentOpenAI},
		{name: "loop over another var's content", src: `{% for m in messages %}{% endfor %}{% for c in other.content %}{% endfor %}`, want: template.ContentString},
		{name: "tuple target gives up", src: `{% set a, b = messages %}{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}`, want: template.ContentString},
		{name: "tuple loop target gives up", src: `{% for m in messages %}{% for k, v in m.content %}{% endfor %}{% endfor %}`, want: template.ContentString},
		{name: "inside a comment or raw block", src: `{# {% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %} #}{% raw %}{% for m in messages %}{% for c in m.content %}{% endraw %}`, want: template.ContentString},
		{name: "indexing is not the content", src: `{% for m in messages %}{% for c in m['content'][0] %}{% endfor %}{% endfor %}`, want: template.ContentString},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, template.DetectContentFormat(tt.src))
		})
	}
}

func TestContentFormatOverride(t *testing.T) {
	r := newRenderer(t, `{{ messages[0].content | tojson }}`, template.Options{ContentFormat: template.ContentOpenAI})
	got, err := r.Render(tokenize.TextChat("user", "hi"))
	require.NoError(t, err)
	assert.Equal(t, `[{"type": "text", "text": "hi"}]`, got)
	f, ok := r.ContentFormat(template.DefaultTemplate)
	assert.True(t, ok)
	assert.Equal(t, template.ContentOpenAI, f)
	assert.True(t, strings.HasPrefix(string(template.ContentString), "str"))
}

// deepToolsBody is a request whose one tool's parameters are arrays nested as deep as
// max_json_depth (128) allows, 4 levels sitting above them (the body, tools, the tool,
// function), around leaves strings "ab": tojson(indent=4) prints each on a line of its
// own behind ~500 spaces, ~100 times the body. (Leaves of one byte, `0,`, printed ~250
// times the body, but the request parser no longer materialises so many values per
// byte: openai.Parse routes such a chat by load without rendering it.)
func deepToolsBody(leaves int) []byte {
	const depth = 124
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":`)
	b.WriteString(strings.Repeat("[", depth))
	b.WriteString(strings.Repeat(`"ab",`, leaves-1) + `"ab"`)
	b.WriteString(strings.Repeat("]", depth))
	b.WriteString(`}}]}`)
	return []byte(b.String())
}

// renderAlloc renders chat and returns the bytes the render allocated.
func renderAlloc(r *template.Renderer, chat *tokenize.Chat) (uint64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := r.Render(chat)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}

// TestTojsonAmplificationIsRefusedBeforeItIsAllocated pins that what a render allocates
// is bounded by MaxOutputBytes (plus the conversion of the request's values, in
// proportion to the body), never by what the template would print. Llama 3.1's
// template (Llama 3.2's, 3.3's, 4's, granite's, glm4's and nemotron's too) prints tools
// with tojson(indent=4): a 256 KiB body of deeply nested arrays of zeros would print
// 66 MB, and the library built all of it, 508 MiB allocated in ~2 s, before the
// prompt's size was checked; a 4 MiB body (the default max_body_bytes) would have been
// ~1 GiB of prompt and ~8 GiB of allocation. The bounded tojson measures its output
// first and refuses it. Every template of the ollama corpus is held to the same bound.
func TestTojsonAmplificationIsRefusedBeforeItIsAllocated(t *testing.T) {
	const bound = 4 * template.DefaultMaxOutputBytes
	opts := template.Options{Now: func() time.Time { return fixedNow }}
	llama31, err := template.New(templatecorpus.Ollama(t, "library/llama3.1:8b"), template.Tokens{Named: map[string]string{"bos_token": "<|begin_of_text|>"}}, opts)
	require.NoError(t, err)
	leaves := []int{128 << 10} // a 640 KiB body, printing 66 MB
	if !testing.Short() && !raceEnabled {
		leaves = append(leaves, (4<<20-1024)/5) // just under the default max_body_bytes
	}
	for _, n := range leaves {
		body := deepToolsBody(n)
		chat := chatOf(t, string(body))
		alloc, err := renderAlloc(llama31, chat)
		t.Logf("Llama 3.1, a %d-byte body: %v; %d KiB allocated", len(body), err, alloc>>10)
		require.ErrorIs(t, err, template.ErrOutputTooLarge)
		require.Less(t, alloc, uint64(bound), "a %d-byte body made the renderer allocate %d MiB", len(body), alloc>>20)
	}

	// A 320 KiB body: each template that pretty-prints it would print ~33 MB, twice
	// the limit.
	chat := chatOf(t, string(deepToolsBody(64<<10)))
	var most uint64
	for _, e := range templatecorpus.All(t) {
		r, err := template.New(e.Template, template.Tokens{}, opts)
		require.NoError(t, err, e.Model)
		alloc, err := renderAlloc(r, chat)
		most = max(most, alloc)
		assert.Less(t, alloc, uint64(bound), "%s allocated %d MiB", e.Model, alloc>>20)
		// glm4 pretty-prints a message's tools (a developer message's), not the request's.
		if strings.Contains(e.Template, "tojson(indent=4)") && e.Model != "library/glm4:9b" {
			assert.ErrorIs(t, err, template.ErrOutputTooLarge, e.Model)
		}
	}
	t.Logf("the %d-byte body, through each ollama template: at most %d KiB allocated", len(deepToolsBody(64<<10)), most>>10)
}

// TestAChatOfManySmallValuesIsRefusedBeforeItIsConverted pins that a render through the
// Jinja library allocates a bounded amount whatever the number of the chat's values:
// each object becomes a library dict of ~536 bytes (its own Go map), so a body of small
// objects grew ~40× when converted (4 MiB of `{"abcd":"ef"}` tools: ~150 MiB), within
// what the request parser reads. Such a chat is now refused as too large (routed by
// load) before anything is converted.
func TestAChatOfManySmallValuesIsRefusedBeforeItIsConverted(t *testing.T) {
	opts := template.Options{Now: func() time.Time { return fixedNow }}
	tokens := template.Tokens{Named: map[string]string{"bos_token": "<s>"}}
	mistral, err := template.New(templatecorpus.Ollama(t, "library/mistral-small:24b"), tokens, opts)
	require.NoError(t, err)
	// Gemma 3's template loops over a message's content: the openai content format.
	gemma3, err := template.New(templatecorpus.Ollama(t, "library/gemma3:1b"), tokens, opts)
	require.NoError(t, err)
	const n = 80_000
	tests := []struct {
		name     string
		renderer *template.Renderer
		body     string
	}{
		{"tools of one short member", mistral, `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[` +
			strings.Repeat(`{"abcd":"ef"},`, n-1) + `{"abcd":"ef"}]}`},
		{"short messages", mistral, `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, n-1) + `{"role":"user","content":"x"}]}`},
		{"tool calls whose arguments hold many objects", mistral, `{"model":"m","messages":[{"role":"user","content":"hi"},` +
			`{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"[` +
			strings.Repeat(`{},`, n-1) + `{}]"}}]}]}`},
		// Each content part becomes a dict of the openai format, a string part too: the
		// estimate took the 400 KiB body's parts for strings (3 MiB), and the render
		// converted them into 42 MiB of dicts.
		{"two-letter string content parts, in the openai content format", gemma3, `{"model":"m","messages":[{"role":"user","content":[` +
			strings.Repeat(`"ab",`, n-1) + `"ab"]}]}`},
		// An assistant's reasoning is converted twice (reasoning and reasoning_content).
		{"reasoning of small objects", mistral, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x","reasoning":[` +
			strings.Repeat(`{"abcd":"efgh"},`, n/2-1) + `{"abcd":"efgh"}]},{"role":"user","content":"hi"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chat := chatOf(t, tt.body)
			alloc, err := renderAlloc(tt.renderer, chat)
			require.ErrorIs(t, err, template.ErrOutputTooLarge)
			assert.Less(t, alloc, uint64(1<<20), "a %d KiB body made the renderer allocate %d KiB", len(tt.body)>>10, alloc>>10)
		})
	}
	// A long agent conversation with tools is well within the bound.
	var b strings.Builder
	b.WriteString(`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],"messages":[`)
	for i := range 2000 {
		fmt.Fprintf(&b, `{"role":"user","content":"question %d"},{"role":"assistant","tool_calls":[{"id":"c%d","type":"function","function":{"name":"f","arguments":"{\"q\":\"x\"}"}}]},{"role":"tool","tool_call_id":"c%d","content":"answer"},`, i, i, i)
	}
	b.WriteString(`{"role":"user","content":"done?"}]}`)
	qwen25, err := template.New(templatecorpus.Ollama(t, "library/qwen2.5:0.5b"), template.Tokens{}, opts)
	require.NoError(t, err)
	_, err = qwen25.Render(chatOf(t, b.String()))
	require.NoError(t, err)
}

// TestRenderDropsEmptyTextPartsInTheStringFormat: vLLM's chat parser keeps a part's
// parse only when it is truthy (chat_utils.py _parse_chat_message_content_parts:
// "if parse_res: content.append(parse_res)"). In the string content format a text part
// parses to its text, so an empty one is dropped before the texts are joined with
// "\n"; in the openai format it parses to a dict, which is kept. A Responses body's
// input_text parts (openai.ResponsesChat) go the same way.
func TestRenderDropsEmptyTextPartsInTheStringFormat(t *testing.T) {
	const dump = `{{ messages | tojson }}`
	const loop = `{% for m in messages %}{% for p in m.content %}{{ p | tojson }}{% endfor %}{% endfor %}`
	tests := []struct {
		name string
		src  string
		chat func(t *testing.T) *tokenize.Chat
		want string
	}{
		{"an empty text part between two", dump, func(t *testing.T) *tokenize.Chat {
			return chatOf(t, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}]}]}`)
		}, `[{"role": "user", "content": "a\nb"}]`},
		{"empty string parts and a trailing empty part", dump, func(t *testing.T) *tokenize.Chat {
			return chatOf(t, `{"model":"m","messages":[{"role":"user","content":["","x",{"type":"input_text","text":""}]}]}`)
		}, `[{"role": "user", "content": "x"}]`},
		{"a tool message's parts", dump, func(t *testing.T) *tokenize.Chat {
			return chatOf(t, `{"model":"m","messages":[{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"out"},{"type":"text","text":""}]}]}`)
		}, `[{"role": "tool", "content": "out", "tool_call_id": "c"}]`},
		{"a Responses message's input_text parts", dump, func(t *testing.T) *tokenize.Chat {
			chat, err := openai.ResponsesChat([]byte(`{"model":"m","input":[{"type":"message","role":"user","content":[`+
				`{"type":"input_text","text":"<environment_context>"},{"type":"input_text","text":""},{"type":"input_text","text":"Fix it."}]}]}`), openai.DefaultLimits())
			require.NoError(t, err)
			return chat
		}, `[{"role": "user", "content": "<environment_context>\nFix it."}]`},
		{"the openai format keeps them", loop, func(t *testing.T) *tokenize.Chat {
			return chatOf(t, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"a"}]}]}`)
		}, `{"type": "text", "text": ""}{"type": "text", "text": "a"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newRenderer(t, tt.src, template.Options{}).Render(tt.chat(t))
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
