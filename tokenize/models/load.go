package models

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/builtin"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/hf"
	"github.com/kvroute/kvroute/tokenize/template"
)

// Deps are what loading a Set needs besides its config.
type Deps struct {
	// Logger gets the warning for a model without an entry; nil discards it.
	Logger *slog.Logger
	// MaxPromptTokens bounds the ids of one prompt (max_prompt_tokens): an engine's
	// reply carrying more is refused, and an in-process tokenizer stops there (or
	// sooner, at its own bound on long words) and returns the prompt's first ids
	// (tokenize.Pipeline.MaxTokens); 0 means 1 << 20.
	MaxPromptTokens int
	// EngineMetrics counts the engine render clients' requests; nil counts nothing.
	EngineMetrics *engine.Metrics
	// HTTPClient, when set, is the engine clients' HTTP client (tests); nil gives each
	// client its own.
	HTTPClient *http.Client
	// TemplateOptions tune the chat renderers (a fixed clock for tests).
	TemplateOptions template.Options
	// TextOnly loads no chat template: a directory without tokenizer_config.json is
	// accepted, and chats fail to encode (`extproc tokenize -completions`).
	TextOnly bool
	// DeferDefault, for a caller that routes no model without an entry (as far as it
	// knows at start), leaves the embedded default (used when the config has no default
	// entry) unloaded until a model without an entry is first encoded, sparing its load
	// time and heap. A configured default entry is always loaded by Load.
	DeferDefault bool
}

// local is a tokenizer (and chat renderer) loaded in process, shared by every model
// whose entry resolves to the same source.
type local struct {
	// name identifies the source in metrics: builtin:NAME, approx, or the tokenizer.json
	// path it was read from.
	name      string
	tokenizer tokenize.Tokenizer
	// renderer is nil when the source has no chat template and the entry's engine
	// renders chats.
	renderer tokenize.ChatRenderer
	// exact is false only for the approximate tokenizer.
	exact bool
}

// stats returns the memo counters of an exact tokenizer (zero for approx).
func (l *local) stats() hf.Stats {
	if t, ok := l.tokenizer.(*hf.Tokenizer); ok {
		return t.Stats()
	}
	return hf.Stats{}
}

// loader loads each source once.
type loader struct {
	deps   Deps
	loaded map[string]*local // by source key
	order  []*local
}

// load resolves and loads the local source of the entry of model (nil if it has none).
// withRenderer asks for its chat renderer too.
func (l *loader) load(model string, e Entry, withRenderer bool) (*local, error) {
	key, _ := e.source()
	var src, dir, tokenizerFile string
	switch key {
	case "":
		return nil, nil
	case "approx":
		src = "approx"
	case "builtin":
		src = "builtin:" + e.Builtin
	case "path":
		abs, err := filepath.Abs(e.Path)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(abs)
		if err != nil {
			return nil, fmt.Errorf("path: %w", err)
		}
		dir, tokenizerFile = abs, filepath.Join(abs, "tokenizer.json")
		if !st.IsDir() {
			dir, tokenizerFile = filepath.Dir(abs), abs
		}
	case "hf_cache":
		repo := e.Repo
		if repo == "" {
			repo = model
			if !validRepo(repo) {
				return nil, fmt.Errorf("repo: the model name %q is not a Hub repository id (ORG/NAME): set repo", model)
			}
		}
		snap, err := snapshotDir(e.HFCache, repo, e.Revision)
		if err != nil {
			return nil, fmt.Errorf("hf_cache: %s: %w", repo, err)
		}
		dir, tokenizerFile = snap, filepath.Join(snap, "tokenizer.json")
	}
	if tokenizerFile != "" {
		// One file reached by two names (a link, a relative path) is one source.
		if real, err := filepath.EvalSymlinks(tokenizerFile); err == nil {
			src = real
		} else {
			src = tokenizerFile
		}
	}
	if got, ok := l.loaded[src]; ok {
		if withRenderer && got.renderer == nil {
			if err := l.addRenderer(got, key, e, dir); err != nil {
				return nil, err
			}
		}
		return got, nil
	}
	loc := &local{name: src, exact: key != "approx"}
	var err error
	switch key {
	case "approx":
		loc.tokenizer, loc.renderer = tokenize.Approx{}, tokenize.ChatML{}
	case "builtin":
		loc.tokenizer, err = hf.LoadBuiltin(e.Builtin)
	default:
		loc.tokenizer, err = hf.Load(tokenizerFile)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if withRenderer && loc.renderer == nil {
		if err := l.addRenderer(loc, key, e, dir); err != nil {
			return nil, err
		}
	}
	l.loaded[src] = loc
	l.order = append(l.order, loc)
	return loc, nil
}

// addRenderer loads the chat template of a source: the builtin's embedded config, or
// the directory's tokenizer_config.json and chat_template.jinja.
func (l *loader) addRenderer(loc *local, key string, e Entry, dir string) error {
	var r *template.Renderer
	var err error
	if key == "builtin" {
		var cfg []byte
		if cfg, err = builtin.TokenizerConfigJSON(e.Builtin); err == nil {
			r, err = template.FromConfig(cfg, l.deps.TemplateOptions)
		}
	} else {
		if _, statErr := os.Stat(filepath.Join(dir, template.ConfigFile)); errors.Is(statErr, fs.ErrNotExist) {
			return fmt.Errorf("%s: no %s in %s, so no chat template: put it beside tokenizer.json, or set engine to render chats", key, template.ConfigFile, dir)
		}
		r, err = template.FromConfigFile(dir, l.deps.TemplateOptions)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	loc.renderer = r
	return nil
}
