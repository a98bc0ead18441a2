package models

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/engine"
)

// Bounds of the set of model names warned about: names come from requests.
const (
	maxWarnedModels   = 1024
	maxWarnedNameSize = 256
)

// Set is every model's prompt encoder, loaded from a [Config] by [Load].
type Set struct {
	models map[string]*model
	def    *model
	locals []*local // distinct in-process tokenizers, in load order
	log    *slog.Logger

	// warned holds the models without an entry already warned about (read on every
	// request for such a model, without a lock); mu serializes additions, counted in
	// nWarned, so the set stays bounded.
	warned  sync.Map
	mu      sync.Mutex
	nWarned int
	full    atomic.Bool // the set is full: the "no further warnings" line was logged
}

// model is one entry, loaded.
type model struct {
	encoder tokenize.PromptEncoder
	// approx: the model's ids are the approximate tokenizer's.
	approx bool
	// source describes the entry for logs and `extproc tokenize`.
	source string
}

// Load loads every entry (and the default) from cfg. Errors name the model and key,
// e.g. tokenizers.Qwen/Qwen3-8B.hf_cache: …
func Load(cfg Config, deps Deps) (*Set, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.MaxPromptTokens <= 0 {
		deps.MaxPromptTokens = 1 << 20
	}
	l := &loader{deps: deps, loaded: map[string]*local{}}
	s := &Set{models: make(map[string]*model, len(cfg)), log: deps.Logger}
	for _, name := range cfg.names() {
		m, err := l.model(name, cfg[name])
		if err != nil {
			return nil, fmt.Errorf("%s.%w", path(name), err)
		}
		if name == DefaultKey {
			s.def = m
			continue
		}
		s.models[name] = m
	}
	if s.def == nil {
		m, err := l.model(DefaultKey, Entry{Builtin: DefaultBuiltin})
		if err != nil {
			return nil, fmt.Errorf("%s (the embedded default): %w", path(DefaultKey), err)
		}
		s.def = m
	}
	s.locals = l.order
	return s, nil
}

// model loads one entry.
func (l *loader) model(name string, e Entry) (*model, error) {
	loc, err := l.load(name, e, e.Engine == nil && !l.deps.TextOnly)
	if err != nil {
		return nil, err
	}
	if e.Engine == nil {
		return &model{encoder: tokenize.Pipeline{Tokenizer: loc.tokenizer, Renderer: loc.renderer}, approx: !loc.exact, source: loc.name}, nil
	}
	client, err := engine.New(*e.Engine, name, l.deps.MaxPromptTokens, l.deps.HTTPClient, l.deps.EngineMetrics)
	if err != nil {
		return nil, fmt.Errorf("engine.%w", err)
	}
	m := &model{encoder: client, source: "engine " + e.Engine.URL}
	if loc != nil {
		m.encoder = engineChats{engine: client, text: tokenize.Pipeline{Tokenizer: loc.tokenizer}}
		m.source += " (completions text: " + loc.name + ")"
	}
	return m, nil
}

// Model returns the prompt encoder of the named model: its entry's, else the
// default's, logging a warning the first time each model without an entry is seen.
func (s *Set) Model(name string) tokenize.PromptEncoder {
	return s.lookup(name).encoder
}

// Approx reports whether the model is tokenized approximately: its ids match no
// engine's, so the engine's KV events cannot match them.
func (s *Set) Approx(name string) bool { return s.lookup(name).approx }

// Source describes where the model's tokenization comes from ("builtin:qwen3", a
// tokenizer.json path, "approx", "engine URL"), noting "(default)" for a model without
// an entry.
func (s *Set) Source(name string) string {
	if m, ok := s.models[name]; ok {
		return m.source
	}
	return s.def.source + " (default)"
}

func (s *Set) lookup(name string) *model {
	if m, ok := s.models[name]; ok {
		return m
	}
	s.warnOnce(name)
	return s.def
}

// warnOnce logs that a model has no entry, once per model name, for at most
// maxWarnedModels names, then once that no more are warned about.
func (s *Set) warnOnce(name string) {
	if len(name) > maxWarnedNameSize {
		name = name[:maxWarnedNameSize]
	}
	if _, seen := s.warned.Load(name); seen || s.full.Load() {
		return
	}
	s.mu.Lock()
	warn, last := false, false
	_, seen := s.warned.Load(name)
	switch {
	case seen:
	case s.nWarned < maxWarnedModels:
		s.warned.Store(name, struct{}{})
		s.nWarned++
		warn = true
	default:
		last = s.full.CompareAndSwap(false, true)
	}
	s.mu.Unlock()
	if warn {
		s.log.Warn("tokenizers: no entry for this model: its prompts are tokenized with the default tokenizer, whose ids may not be the engine's (add the model under tokenizers)", "model", name, "tokenizer", s.def.source)
	}
	if last {
		s.log.Warn(fmt.Sprintf("tokenizers: more than %d models without an entry seen: no further warnings", maxWarnedModels))
	}
}

// engineChats renders chats on the engine and encodes completions text in process.
type engineChats struct {
	engine tokenize.PromptEncoder
	text   tokenize.Pipeline
}

func (e engineChats) EncodePrompt(ctx context.Context, p tokenize.Prompt) (string, []uint32, error) {
	if p.Chat != nil {
		return e.engine.EncodePrompt(ctx, p)
	}
	return e.text.EncodePrompt(ctx, p)
}
