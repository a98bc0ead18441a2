package template_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/templatecorpus"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

// FuzzRender feeds hostile request bodies through the request parser into renderers of
// Qwen3's, Llama 3.1's and Llama 3's templates (all with their direct renderers), a
// template that loops over content parts (vLLM's openai format) and one that dumps
// everything with tojson. A render may fail, but only with one of the
// package's errors, and never panics or exceeds its output cap.
func FuzzRender(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "chats", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		body, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	const maxOutput = 1 << 20
	opts := template.Options{Now: func() time.Time { return fixedNow }, MaxOutputBytes: maxOutput}
	qwen3, err := template.FromConfigFile(filepath.Join("testdata", "configs", "qwen3"), opts)
	if err != nil {
		f.Fatal(err)
	}
	llamaTokens := template.Tokens{Named: map[string]string{"bos_token": "<|begin_of_text|>"}}
	llama31, err := template.New(templatecorpus.Ollama(f, "library/llama3.1:8b"), llamaTokens, opts)
	if err != nil {
		f.Fatal(err)
	}
	llama30, err := template.New(templatecorpus.Ollama(f, "library/llama3:8b"), llamaTokens, opts)
	if err != nil {
		f.Fatal(err)
	}
	parts, err := template.New(`{% for m in messages %}{{ m.role }}{% for p in m.content %}[{{ p.type }}:{{ p.text }}]{% endfor %}{% endfor %}`, template.Tokens{}, opts)
	if err != nil {
		f.Fatal(err)
	}
	dump, err := template.New(`{{ messages | tojson(indent=2) }}{{ tools | tojson }}{{ documents | tojson }}{% for m in messages %}{% for c in m.tool_calls | default([]) %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}`, template.Tokens{}, opts)
	if err != nil {
		f.Fatal(err)
	}
	renderers := []*template.Renderer{qwen3, llama31, llama30, parts, dump}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
		if err != nil || req.Chat == nil {
			return
		}
		for _, r := range renderers {
			out, err := r.Render(req.Chat)
			switch {
			case err == nil && len(out) > maxOutput:
				t.Fatalf("output of %d bytes over the cap", len(out))
			case err != nil && !errors.Is(err, template.ErrRender) && !errors.Is(err, template.ErrTemplate) &&
				!errors.Is(err, template.ErrUnsupportedContent) && !errors.Is(err, template.ErrOutputTooLarge) &&
				!errors.Is(err, tokenize.ErrNoMessages):
				t.Fatalf("error outside the package's kinds: %v", err)
			}
		}
	})
}

// FuzzNew compiles arbitrary template sources: templates are configuration, but loading
// one (whitespace resolution, content-format detection, the library's parser) must fail
// with an error rather than panic, and a compiled template must render a chat without
// panicking.
func FuzzNew(f *testing.F) {
	body, err := os.ReadFile(filepath.Join("testdata", "templates", "syntax.json"))
	if err != nil {
		f.Fatal(err)
	}
	var syntax struct{ Templates []struct{ Template string } }
	if err := json.Unmarshal(body, &syntax); err != nil {
		f.Fatal(err)
	}
	for _, e := range syntax.Templates {
		f.Add(e.Template)
	}
	for _, s := range []string{"{% raw %}{{ x }}{% endraw %}", "{%- raw -%} a {%- endraw -%}", "{{ '%}' }}{# {{ #}", "{% for a, b in messages %}{% set x.y = 1 %}{% endfor %}", "{% if (messages[0]['content'] | list)[1:] is string %}{% endif %}",
		"{{ messages | map('tojson', indent=2) | join }}{% filter tojson %}{{ tools }}{% endfilter %}{{ x | tojson.y }}"} {
		f.Add(s)
	}
	chat := tokenize.TextChat("system", "s", "user", "u")
	f.Fuzz(func(t *testing.T, src string) {
		template.DetectContentFormat(src)
		r, err := template.New(src, template.Tokens{}, template.Options{MaxOutputBytes: 1 << 16, Now: func() time.Time { return fixedNow }})
		if err != nil {
			return
		}
		_, _ = r.Render(chat)
	})
}
