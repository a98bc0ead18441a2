package models_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// tinyTokenizer is a tokenizer.json of five tokens: a, b, ab, space and <s>, the BOS a
// completions prompt gets.
const tinyTokenizer = `{
  "version": "1.0",
  "added_tokens": [{"id": 4, "content": "<s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}],
  "normalizer": null,
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}},
  "decoder": null,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, " ": 3}, "merges": ["a b"]}
}`

// tinyConfig's template writes <s> then each message's content, space-separated.
const tinyConfig = `{"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}"}`

// writeDir writes a tokenizer directory: tokenizer.json, and the config and template
// when not empty.
func writeDir(t *testing.T, dir, config, template string) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tinyTokenizer), 0o644))
	if config != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644))
	}
	if template != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(template), 0o644))
	}
	return dir
}

// approx as the default entry keeps a test off loading the embedded tokenizer (seconds
// under the race detector).
var approx = models.Entry{Approx: true}

func encode(t *testing.T, s *models.Set, model string, p tokenize.Prompt) (string, []uint32) {
	t.Helper()
	enc, err := s.Model(model).EncodePrompt(context.Background(), p)
	require.NoError(t, err)
	return enc.Text, enc.IDs
}

func TestConfigValidateNamesTheKey(t *testing.T) {
	tests := []struct {
		name string
		cfg  models.Config
		want string // "" for valid
	}{
		{"each source alone", models.Config{"a": {Path: "x"}, "b": {HFCache: "/c"}, "c": {Builtin: "qwen3"}, "d": {Approx: true}, "e": {Engine: &engine.Config{URL: "http://r:8000"}}}, ""},
		{"a local tokenizer with an engine", models.Config{"m": {Path: "x", Engine: &engine.Config{URL: "http://r:8000"}}}, ""},
		{"nothing set", models.Config{"m": {}}, "tokenizers.m.path: one of path, hf_cache, builtin, approx or engine is required"},
		{"two sources", models.Config{"m": {Path: "x", Builtin: "qwen3"}}, "tokenizers.m.builtin: only one of path, hf_cache, builtin and approx may be set"},
		{"unknown builtin", models.Config{"m": {Builtin: "llama"}}, `tokenizers.m.builtin: unknown embedded tokenizer "llama" (have qwen3)`},
		{"repo without hf_cache", models.Config{"m": {Path: "x", Repo: "a/b"}}, "tokenizers.m.repo: only read with hf_cache"},
		{"revision without hf_cache", models.Config{"m": {Path: "x", Revision: "main"}}, "tokenizers.m.revision: only read with hf_cache"},
		{"a repo of three parts", models.Config{"m": {HFCache: "/c", Repo: "a/b/c"}}, `tokenizers.m.repo: want ORG/NAME or NAME, got "a/b/c"`},
		{"a revision with a separator", models.Config{"m": {HFCache: "/c", Revision: "../x"}}, `tokenizers.m.revision: want a ref name or a commit hash, got "../x"`},
		{"approx with an engine", models.Config{"m": {Approx: true, Engine: &engine.Config{URL: "http://r"}}}, "tokenizers.m.engine: the approximate tokenizer cannot be combined with an engine"},
		{"engine without url", models.Config{"m": {Engine: &engine.Config{}}}, "tokenizers.m.engine.url: required"},
		{"engine url with credentials", models.Config{"m": {Engine: &engine.Config{URL: "http://u:p@r"}}}, "tokenizers.m.engine.url: must not carry credentials"},
		{"engine negative timeout", models.Config{"m": {Engine: &engine.Config{URL: "http://r", Timeout: -time.Second}}}, "tokenizers.m.engine.timeout: must be > 0"},
		{"engine negative concurrency", models.Config{"m": {Engine: &engine.Config{URL: "http://r", MaxConcurrency: -1}}}, "tokenizers.m.engine.max_concurrency: must be > 0"},
		{"the default entry", models.Config{"default": {}}, "tokenizers.default.path:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.want), "got %q, want it to start with %q", err, tt.want)
		})
	}
}

func TestPathIsAFileOrADirectory(t *testing.T) {
	root := t.TempDir()
	dir := writeDir(t, filepath.Join(root, "withconfig"), tinyConfig, "")
	override := writeDir(t, filepath.Join(root, "withjinja"), tinyConfig, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
	bare := writeDir(t, filepath.Join(root, "bare"), "", "")

	s, err := models.Load(models.Config{
		"dir":       {Path: dir},
		"file":      {Path: filepath.Join(dir, "tokenizer.json")},
		"jinja":     {Path: override},
		"completes": {Path: filepath.Join(bare, "tokenizer.json"), Engine: &engine.Config{URL: "http://127.0.0.1:1"}},
		"default":   approx,
	}, models.Deps{})
	require.NoError(t, err)

	chat := tokenize.Prompt{Chat: tokenize.TextChat("user", "ab", "assistant", "a b")}
	text, ids := encode(t, s, "dir", chat)
	assert.Equal(t, "<s>ab a b ", text)
	assert.Equal(t, []uint32{4, 2, 3, 0, 3, 1, 3}, ids, "a chat is encoded without adding special tokens: the template wrote <s>")
	_, ids = encode(t, s, "file", chat)
	assert.Equal(t, []uint32{4, 2, 3, 0, 3, 1, 3}, ids, "a tokenizer.json path reads the config beside it")
	text, _ = encode(t, s, "jinja", chat)
	assert.Equal(t, "<s>aba b", text, "chat_template.jinja replaces the config's template")

	text, ids = encode(t, s, "completes", tokenize.Prompt{Text: "ab b"})
	assert.Equal(t, "ab b", text)
	assert.Equal(t, []uint32{4, 2, 3, 1}, ids, "completions text is encoded in process with the special tokens")
	assert.Equal(t, "engine http://127.0.0.1:1 (completions text: "+filepath.Join(bare, "tokenizer.json")+")", s.Source("completes"))

	_, err = models.Load(models.Config{"m": {Path: bare}}, models.Deps{})
	require.ErrorContains(t, err, "tokenizers.m.path: no tokenizer_config.json in "+bare)
	textOnly, err := models.Load(models.Config{"m": {Path: bare}, "default": approx}, models.Deps{TextOnly: true})
	require.NoError(t, err, "TextOnly loads no template")
	_, ids = encode(t, textOnly, "m", tokenize.Prompt{Text: "ab"})
	assert.Equal(t, []uint32{4, 2}, ids)
	_, err = textOnly.Model("m").EncodePrompt(context.Background(), chat)
	require.ErrorContains(t, err, "no chat template", "a chat is an error, not a panic")
	_, err = models.Load(models.Config{"m": {Path: filepath.Join(root, "missing")}}, models.Deps{})
	require.ErrorContains(t, err, "tokenizers.m.path: ")
	require.NoError(t, os.WriteFile(filepath.Join(bare, "tokenizer.json"), []byte(`{"model":{"type":"Unigram"}}`), 0o644))
	_, err = models.Load(models.Config{"m": {Path: filepath.Join(bare, "tokenizer.json"), Engine: &engine.Config{URL: "http://r"}}}, models.Deps{})
	require.ErrorContains(t, err, "tokenizers.m.path: ", "a component the encoder does not reproduce fails at load")
}

// hubCache lays out a Hugging Face hub cache for repo with the given snapshots (each a
// tokenizer directory whose template prints its name) and refs/main naming main ("" for
// none).
func hubCache(t *testing.T, repo, main string, snapshots ...string) string {
	t.Helper()
	cache := t.TempDir()
	repoDir := filepath.Join(cache, "models--"+strings.ReplaceAll(repo, "/", "--"))
	for i, rev := range snapshots {
		dir := writeDir(t, filepath.Join(repoDir, "snapshots", rev), tinyConfig, rev+"{{ messages[0].content }}")
		at := time.Now().Add(time.Duration(i-len(snapshots)) * time.Hour) // later ones are newer
		require.NoError(t, os.Chtimes(dir, at, at))
	}
	if main != "" {
		require.NoError(t, os.MkdirAll(filepath.Join(repoDir, "refs"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repoDir, "refs", "main"), []byte(main+"\n"), 0o644))
	}
	return cache
}

func TestHFCacheReadsTheSnapshotInItsOwnLayout(t *testing.T) {
	chat := tokenize.Prompt{Chat: tokenize.TextChat("user", "ab")}
	tests := []struct {
		name    string
		model   string
		entry   func(cache string) models.Entry
		main    string
		snaps   []string
		want    string // the rendered prompt: the snapshot's name, then "ab"
		wantErr string
	}{
		{"refs/main names the snapshot", "Org/Model", func(c string) models.Entry { return models.Entry{HFCache: c} }, "aaa", []string{"aaa", "bbb"}, "aaaab", ""},
		{"else the newest snapshot", "Org/Model", func(c string) models.Entry { return models.Entry{HFCache: c} }, "", []string{"aaa", "ccc", "bbb"}, "bbbab", ""},
		{"a stale refs/main falls back to the newest", "Org/Model", func(c string) models.Entry { return models.Entry{HFCache: c} }, "gone", []string{"aaa", "bbb"}, "bbbab", ""},
		{"a revision by commit", "Org/Model", func(c string) models.Entry { return models.Entry{HFCache: c, Revision: "aaa"} }, "bbb", []string{"aaa", "bbb"}, "aaaab", ""},
		{"repo differs from the model name", "served-name", func(c string) models.Entry { return models.Entry{HFCache: c, Repo: "Org/Model"} }, "aaa", []string{"aaa"}, "aaaab", ""},
		{"a model not in the cache", "Org/Other", func(c string) models.Entry { return models.Entry{HFCache: c} }, "aaa", []string{"aaa"}, "", "tokenizers.Org/Other.hf_cache: Org/Other: no models--Org--Other in the cache"},
		{"an unknown revision", "Org/Model", func(c string) models.Entry { return models.Entry{HFCache: c, Revision: "v2"} }, "aaa", []string{"aaa"}, "", `tokenizers.Org/Model.hf_cache: Org/Model: revision "v2": no snapshot`},
		{"a model name that is no repository id", "a/b/c", func(c string) models.Entry { return models.Entry{HFCache: c} }, "aaa", []string{"aaa"}, "", "tokenizers.a/b/c.repo: the model name \"a/b/c\" is not a Hub repository id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := hubCache(t, "Org/Model", tt.main, tt.snaps...)
			s, err := models.Load(models.Config{tt.model: tt.entry(cache), "default": approx}, models.Deps{})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			text, _ := encode(t, s, tt.model, chat)
			assert.Equal(t, tt.want, text)
		})
	}
	t.Run("HF_HOME: the directory above hub/", func(t *testing.T) {
		cache := hubCache(t, "Org/Model", "aaa", "aaa")
		home := t.TempDir()
		require.NoError(t, os.Rename(cache, filepath.Join(home, "hub")))
		s, err := models.Load(models.Config{"Org/Model": {HFCache: home}, "default": approx}, models.Deps{})
		require.NoError(t, err)
		text, _ := encode(t, s, "Org/Model", chat)
		assert.Equal(t, "aaaab", text)
	})
}

// TestEngineAPIKeysAreReadAtLoadAndAgainOnRequest: Load reads each engine entry's API
// key, failing with the key's path when it cannot; ReadAPIKeys reads them again and
// changes nothing until apply, nor anything at all when one fails.
func TestEngineAPIKeysAreReadAtLoadAndAgainOnRequest(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, `[{"token_ids":[1]}]`)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("k1\n"), 0o600))
	t.Setenv("KVROUTE_TEST_MODELS_KEY", "k2")
	cfg := models.Config{
		"file":    {Engine: &engine.Config{URL: srv.URL, APIKeyFile: keyFile}},
		"env":     {Engine: &engine.Config{URL: srv.URL, APIKeyEnv: "KVROUTE_TEST_MODELS_KEY"}},
		"none":    {Engine: &engine.Config{URL: srv.URL}},
		"default": approx,
	}
	s, err := models.Load(cfg, models.Deps{})
	require.NoError(t, err)
	render := func() []string {
		t.Helper()
		mu.Lock()
		got = nil
		mu.Unlock()
		for _, m := range []string{"file", "env", "none"} {
			encode(t, s, m, tokenize.Prompt{Text: "x", Body: []byte(`{"prompt":"x"}`)})
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	assert.Equal(t, []string{"Bearer k1", "Bearer k2", ""}, render())

	require.NoError(t, os.WriteFile(keyFile, []byte("k3"), 0o600))
	apply, err := s.ReadAPIKeys()
	require.NoError(t, err)
	assert.Equal(t, []string{"Bearer k1", "Bearer k2", ""}, render(), "nothing changes before apply")
	apply()
	assert.Equal(t, []string{"Bearer k3", "Bearer k2", ""}, render())

	require.NoError(t, os.WriteFile(keyFile, nil, 0o600))
	_, err = s.ReadAPIKeys()
	require.EqualError(t, err, "tokenizers.file.engine.api_key_file: "+keyFile+" is empty")
	assert.Equal(t, []string{"Bearer k3", "Bearer k2", ""}, render(), "a failed read changes nothing")

	_, err = models.Load(cfg, models.Deps{})
	require.EqualError(t, err, "tokenizers.file.engine.api_key_file: "+keyFile+" is empty")
}
