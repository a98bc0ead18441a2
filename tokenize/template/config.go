package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/jsonv"
)

// The files of a Hugging Face tokenizer directory this package reads.
const (
	ConfigFile           = "tokenizer_config.json"
	TemplateFile         = "chat_template.jinja"
	TemplatesDir         = "chat_templates"
	SpecialTokensMapFile = "special_tokens_map.json"
)

// configMaxDepth bounds the nesting of a tokenizer_config.json.
const configMaxDepth = 64

// FromConfigFile loads a model's chat template the way transformers loads a tokenizer
// directory: path is that directory or its tokenizer_config.json. The config's
// chat_template (a string, or a list of {"name", "template"}) and special tokens are
// read; a chat_template.jinja beside it replaces the config's template, and
// chat_templates/NAME.jinja files add named templates; special_tokens_map.json, when
// present, overrides the config's special tokens.
func FromConfigFile(path string, opts Options) (*Renderer, error) {
	dir, file := path, filepath.Join(path, ConfigFile)
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	} else if !st.IsDir() {
		dir, file = filepath.Dir(path), path
	}
	config, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	templates, tokens, err := parseConfig(config)
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", file, err)
	}
	if src, err := os.ReadFile(filepath.Join(dir, TemplateFile)); err == nil {
		templates = map[string]string{DefaultTemplate: string(src)}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template: %w", err)
	}
	extra, err := filepath.Glob(filepath.Join(dir, TemplatesDir, "*.jinja"))
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if len(extra) > 0 {
		named := map[string]string{}
		if t, ok := templates[DefaultTemplate]; ok && len(templates) == 1 {
			named[DefaultTemplate] = t
		}
		for _, f := range extra {
			src, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("template: %w", err)
			}
			named[strings.TrimSuffix(filepath.Base(f), ".jinja")] = string(src)
		}
		templates = named
	}
	if mapFile, err := os.ReadFile(filepath.Join(dir, SpecialTokensMapFile)); err == nil {
		if err := overrideTokens(&tokens, mapFile); err != nil {
			return nil, fmt.Errorf("template: %s: %w", SpecialTokensMapFile, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("template: %w", err)
	}
	if len(templates) == 0 {
		return nil, fmt.Errorf("template: %s: no chat_template and no %s (a model whose chat format is not Jinja, such as gpt-oss's Harmony, needs the engine render mode)", file, TemplateFile)
	}
	return NewNamed(templates, tokens, opts)
}

// FromConfig builds a renderer from the bytes of a tokenizer_config.json alone.
func FromConfig(config []byte, opts Options) (*Renderer, error) {
	templates, tokens, err := parseConfig(config)
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", ConfigFile, err)
	}
	if len(templates) == 0 {
		return nil, fmt.Errorf("template: %s has no chat_template", ConfigFile)
	}
	return NewNamed(templates, tokens, opts)
}

// parseConfig reads the chat templates (none if the config has none) and the special
// tokens of a tokenizer_config.json.
func parseConfig(config []byte) (map[string]string, Tokens, error) {
	root, err := jsonv.Parse(config, configMaxDepth)
	if err != nil {
		return nil, Tokens{}, err
	}
	if root.Kind() != jsonv.Object {
		return nil, Tokens{}, errors.New("not a JSON object")
	}
	templates := map[string]string{}
	switch ct, _ := root.Get("chat_template"); ct.Kind() {
	case jsonv.Null:
	case jsonv.String:
		templates[DefaultTemplate] = ct.Str()
	case jsonv.Array:
		for i, it := range ct.Items() {
			name, _ := it.Get("name")
			src, _ := it.Get("template")
			if name.Kind() != jsonv.String || src.Kind() != jsonv.String {
				return nil, Tokens{}, fmt.Errorf("chat_template[%d]: want {\"name\": string, \"template\": string}", i)
			}
			templates[name.Str()] = src.Str()
		}
	default:
		return nil, Tokens{}, fmt.Errorf("chat_template: want a string or a list of named templates, got %s", ct.Kind())
	}
	var tokens Tokens
	if err := overrideTokensFrom(&tokens, root); err != nil {
		return nil, Tokens{}, err
	}
	return templates, tokens, nil
}

// overrideTokens applies the special tokens of a special_tokens_map.json.
func overrideTokens(tokens *Tokens, mapFile []byte) error {
	root, err := jsonv.Parse(mapFile, configMaxDepth)
	if err != nil {
		return err
	}
	return overrideTokensFrom(tokens, root)
}

// overrideTokensFrom sets each special token obj names, given as a string or an
// AddedToken object {"content": …}; an empty or null token is left unset, as
// transformers' special tokens map leaves it out.
func overrideTokensFrom(tokens *Tokens, obj jsonv.Value) error {
	// transformers' named special tokens (SPECIAL_TOKENS_ATTRIBUTES).
	for _, name := range [...]string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
		v, ok := obj.Get(name)
		if !ok {
			continue
		}
		text, err := tokenText(v)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if tokens.Named == nil {
			tokens.Named = map[string]string{}
		}
		if text == "" {
			delete(tokens.Named, name)
			continue
		}
		tokens.Named[name] = text
	}
	if v, ok := obj.Get("additional_special_tokens"); ok {
		if v.Kind() != jsonv.Array && !v.IsNull() {
			return fmt.Errorf("additional_special_tokens: want a list, got %s", v.Kind())
		}
		tokens.Additional = nil
		for i, it := range v.Items() {
			text, err := tokenText(it)
			if err != nil {
				return fmt.Errorf("additional_special_tokens[%d]: %w", i, err)
			}
			tokens.Additional = append(tokens.Additional, text)
		}
	}
	return nil
}

func tokenText(v jsonv.Value) (string, error) {
	switch v.Kind() {
	case jsonv.Null:
		return "", nil
	case jsonv.String:
		return v.Str(), nil
	case jsonv.Object:
		if c, ok := v.Get("content"); ok && c.Kind() == jsonv.String {
			return c.Str(), nil
		}
	}
	return "", fmt.Errorf("want a string or an AddedToken object with a string content, got %s", v.Kind())
}

// Names returns the renderer's template names, sorted.
func (r *Renderer) Names() []string {
	names := make([]string, 0, len(r.templates))
	for n := range r.templates {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
