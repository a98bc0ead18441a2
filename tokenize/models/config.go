package models

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/tokenize/builtin"
	"github.com/kvroute/kvroute/tokenize/engine"
)

// DefaultKey is the entry used for every model without its own.
const DefaultKey = "default"

// DefaultBuiltin is the embedded tokenizer a Set uses for models without an entry when
// the config has no DefaultKey entry.
const DefaultBuiltin = "qwen3"

// Config is the tokenizers section: an entry per model name, plus DefaultKey.
type Config map[string]Entry

// Entry says where one model's tokenizer and chat template come from. Exactly one of
// Path, HFCache, Builtin and Approx is set, or none of them with Engine.
type Entry struct {
	// Path is a tokenizer.json file, or a directory holding tokenizer.json beside
	// tokenizer_config.json and an optional chat_template.jinja.
	Path string `yaml:"path,omitempty"`
	// HFCache is a Hugging Face hub cache directory (HF_HUB_CACHE, e.g.
	// ~/.cache/huggingface/hub): the model's files are read from its snapshot.
	HFCache string `yaml:"hf_cache,omitempty"`
	// Repo is the Hub repository (ORG/NAME) to read from HFCache; empty means the model
	// name.
	Repo string `yaml:"repo,omitempty"`
	// Revision is the snapshot to read from HFCache: a ref (a branch or tag under refs/)
	// or a commit hash; empty means refs/main, else the newest snapshot.
	Revision string `yaml:"revision,omitempty"`
	// Builtin names an embedded tokenizer (qwen3).
	Builtin string `yaml:"builtin,omitempty"`
	// Approx selects the approximate file-free tokenizer and ChatML renderer: counts in
	// the right range, ids no engine's (its blocks never match KV events).
	Approx bool `yaml:"approx,omitempty"`
	// Engine, when set, sends chats to the engine's render endpoint instead of rendering
	// them here; completions prompts too unless a local tokenizer is also configured.
	Engine *engine.Config `yaml:"engine,omitempty"`
	// MessagesInlineSystem is how the model's engine places an Anthropic Messages
	// request's inline system messages (vLLM's inline_system option of its Messages
	// handler): "auto" (also when empty, vLLM's default) probes the model's template and
	// tokenizer once, as vLLM does; "preserve" keeps them in place as system turns;
	// "fold" merges them into a neighbouring message. An engine entry, whose template
	// kvroute does not have, needs preserve or fold for such requests to be routed on
	// their prompt.
	MessagesInlineSystem string `yaml:"messages_inline_system,omitempty"`
	// ExcludeToolsWhenToolChoiceNone mirrors the model's vLLM server flag
	// --exclude-tools-when-tool-choice-none: a chat whose tool_choice vLLM reads as
	// "none" (tokenize.Chat.ToolChoiceNone; chat completions, and the Responses and
	// Messages bodies vLLM converts to chats) is rendered without its tools, as that
	// server renders it. Left false, the tools are rendered whatever tool_choice says,
	// vLLM's default. An engine entry cannot set it: the engine renders the chats,
	// applying its own flag.
	ExcludeToolsWhenToolChoiceNone bool `yaml:"exclude_tools_when_tool_choice_none,omitempty"`
}

// Validate checks every entry's shape without reading any file; errors name the key
// (tokenizers.MODEL.KEY).
func (c Config) Validate() error {
	for _, name := range c.names() {
		if err := c[name].validate(); err != nil {
			return fmt.Errorf("%s.%w", path(name), err)
		}
	}
	return nil
}

// names returns the entries' model names, sorted, so errors come in a stable order.
func (c Config) names() []string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// path is the YAML path of a model's entry.
func path(model string) string { return "tokenizers." + model }

// source names the local source an entry sets ("" for none) and how many it sets.
func (e Entry) source() (string, int) {
	key, n := "", 0
	for _, s := range []struct {
		key string
		set bool
	}{{"path", e.Path != ""}, {"hf_cache", e.HFCache != ""}, {"builtin", e.Builtin != ""}, {"approx", e.Approx}} {
		if s.set {
			key, n = s.key, n+1
		}
	}
	return key, n
}

func (e Entry) validate() error {
	key, n := e.source()
	switch {
	case n > 1:
		return fmt.Errorf("%s: only one of path, hf_cache, builtin and approx may be set", key)
	case n == 0 && e.Engine == nil:
		return fmt.Errorf("path: one of path, hf_cache, builtin, approx or engine is required")
	case e.Builtin != "" && !contains(builtin.Names(), e.Builtin):
		return fmt.Errorf("builtin: unknown embedded tokenizer %q (have %s)", e.Builtin, strings.Join(builtin.Names(), ", "))
	case (e.Repo != "" || e.Revision != "") && e.HFCache == "":
		k := "repo"
		if e.Repo == "" {
			k = "revision"
		}
		return fmt.Errorf("%s: only read with hf_cache", k)
	case e.Approx && e.Engine != nil:
		return fmt.Errorf("engine: the approximate tokenizer cannot be combined with an engine")
	case e.ExcludeToolsWhenToolChoiceNone && e.Engine != nil:
		// It would change nothing, yet read as if it set the engine's flag.
		return fmt.Errorf("exclude_tools_when_tool_choice_none: not read with engine: the engine renders the chats, by its own --exclude-tools-when-tool-choice-none")
	}
	switch e.MessagesInlineSystem {
	case "", InlineSystemAuto, InlineSystemPreserve, InlineSystemFold:
	default:
		return fmt.Errorf("messages_inline_system: want auto, preserve or fold, got %q", e.MessagesInlineSystem)
	}
	if e.Repo != "" && !validRepo(e.Repo) {
		return fmt.Errorf("repo: want ORG/NAME or NAME, got %q", e.Repo)
	}
	if e.Revision != "" && (strings.ContainsAny(e.Revision, `/\`) || e.Revision == "." || e.Revision == "..") {
		return fmt.Errorf("revision: want a ref name or a commit hash, got %q", e.Revision)
	}
	if e.Engine != nil {
		if err := e.Engine.Validate(); err != nil {
			return fmt.Errorf("engine.%w", err)
		}
	}
	return nil
}

// validRepo accepts a Hub repository id: NAME or ORG/NAME, neither part empty, "." or
// "..", nor holding a separator the cache layout would misread.
func validRepo(repo string) bool {
	parts := strings.Split(repo, "/")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || strings.Contains(p, `\`) || strings.Contains(p, "--") {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
