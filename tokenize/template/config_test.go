package template_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

// writeDir writes files (name → content) into a fresh directory.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	}
	return dir
}

func TestFromConfigFile(t *testing.T) {
	const show = `{{ bos_token | default('-') }}|{{ eos_token | default('-') }}|{{ additional_special_tokens | default([]) | join(',') }}|`
	tests := []struct {
		name     string
		files    map[string]string
		file     string // path below the directory; empty loads the directory
		tools    bool
		want     string
		wantErr  string
		wantList []string
	}{
		{
			name:  "string template and AddedToken objects",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":"` + show + `default","bos_token":{"__type":"AddedToken","content":"<B>"},"eos_token":"<E>","pad_token":null,"additional_special_tokens":["<x>",{"content":"<y>"}]}`},
			want:  "<B>|<E>|<x>,<y>|default",
		},
		{
			name:  "the config file itself",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":"file","eos_token":"<E>"}`},
			file:  "tokenizer_config.json",
			want:  "file",
		},
		{
			name:     "named templates: tool_use when the chat has tools",
			files:    map[string]string{"tokenizer_config.json": `{"chat_template":[{"name":"default","template":"plain"},{"name":"tool_use","template":"tools"}]}`},
			tools:    true,
			want:     "tools",
			wantList: []string{"default", "tool_use"},
		},
		{
			name:  "named templates: default without tools",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":[{"name":"default","template":"plain"},{"name":"tool_use","template":"tools"}]}`},
			want:  "plain",
		},
		{
			name:  "tools but no tool_use template",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":"only"}`},
			tools: true,
			want:  "only",
		},
		{
			name:  "chat_template.jinja replaces the config's template",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":"config"}`, "chat_template.jinja": "jinja file\n"},
			want:  "jinja file",
		},
		{
			name:  "chat_template.jinja for a config without one",
			files: map[string]string{"tokenizer_config.json": `{"eos_token":"<E>"}`, "chat_template.jinja": show},
			want:  "-|<E>||",
		},
		{
			name: "chat_templates directory adds named templates",
			files: map[string]string{"tokenizer_config.json": `{}`, "chat_template.jinja": "main",
				"chat_templates/tool_use.jinja": "with tools"},
			tools:    true,
			want:     "with tools",
			wantList: []string{"default", "tool_use"},
		},
		{
			name:  "special_tokens_map.json overrides the config",
			files: map[string]string{"tokenizer_config.json": `{"chat_template":"` + show + `","bos_token":"<B>","eos_token":"<E>"}`, "special_tokens_map.json": `{"bos_token":{"content":"<BB>"},"eos_token":""}`},
			want:  "<BB>|-||",
		},
		{name: "no template (gpt-oss, Mistral-7B v0.1)", files: map[string]string{"tokenizer_config.json": `{"eos_token":"<E>"}`}, wantErr: "engine render mode"},
		{name: "no config", files: map[string]string{"chat_template.jinja": "x"}, wantErr: "tokenizer_config.json"},
		{name: "named templates without default", files: map[string]string{"tokenizer_config.json": `{"chat_template":[{"name":"tool_use","template":"x"}]}`}, wantErr: `no "default"`},
		{name: "template of the wrong type", files: map[string]string{"tokenizer_config.json": `{"chat_template":7}`}, wantErr: "chat_template"},
		{name: "named template entry malformed", files: map[string]string{"tokenizer_config.json": `{"chat_template":[{"name":"default"}]}`}, wantErr: "chat_template[0]"},
		{name: "special token of the wrong type", files: map[string]string{"tokenizer_config.json": `{"chat_template":"x","bos_token":1}`}, wantErr: "bos_token"},
		{name: "not JSON", files: map[string]string{"tokenizer_config.json": `{`}, wantErr: "tokenizer_config.json"},
		{name: "template syntax error", files: map[string]string{"tokenizer_config.json": `{"chat_template":"{% for %}"}`}, wantErr: "compile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeDir(t, tt.files)
			r, err := template.FromConfigFile(filepath.Join(dir, tt.file), template.Options{})
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			chat := tokenize.TextChat("user", "x")
			if tt.tools {
				chat.Tools = chatOf(t, `{"model":"m","messages":[{"role":"user"}],"tools":[{"type":"function","function":{"name":"f"}}]}`).Tools
			}
			got, err := r.Render(chat)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			if tt.wantList != nil {
				assert.Equal(t, tt.wantList, r.Names())
			}
		})
	}
	t.Run("missing path", func(t *testing.T) {
		_, err := template.FromConfigFile(filepath.Join(t.TempDir(), "nope"), template.Options{})
		assert.Error(t, err)
	})
}

func TestConfigsWithoutJinjaTemplateFail(t *testing.T) {
	for _, name := range []string{"mistral7b", "gptoss"} {
		t.Run(name, func(t *testing.T) {
			_, err := template.FromConfigFile(filepath.Join("testdata", "configs", name), template.Options{})
			assert.ErrorContains(t, err, "no chat_template")
			assert.ErrorContains(t, err, "engine render mode")
		})
	}
}

func TestFromConfig(t *testing.T) {
	config, err := os.ReadFile(filepath.Join("testdata", "configs", "qwen3", "tokenizer_config.json"))
	require.NoError(t, err)
	r, err := template.FromConfig(config, template.Options{})
	require.NoError(t, err)
	got, err := r.Render(tokenize.TextChat("user", "hi"))
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", got)

	_, err = template.FromConfig([]byte(`{"eos_token":"x"}`), template.Options{})
	assert.ErrorContains(t, err, "no chat_template")
}
