package models

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// unlisted encodes the models without an entry: def's encoder, marking its
	// encodings approximate when def is the embedded default (guessed).
	unlisted tokenize.PromptEncoder
	locals   []*local // distinct in-process tokenizers, in load order
	log      *slog.Logger
	// deferred is the embedded default when its load waits for the first model without
	// an entry (Deps.DeferDefault); def's encoder is then deferred.
	deferred *deferredModel
	// keyed are the engine clients whose API key a reload reads again.
	keyed []keyedClient

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
	// engine is the entry's render client, nil without one.
	engine *engine.Client
}

// keyedClient is a render client with an API key source (api_key_file, api_key_env).
type keyedClient struct {
	model  string
	cfg    engine.Config
	client *engine.Client
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
		if e := cfg[name].Engine; e != nil && (e.APIKeyFile != "" || e.APIKeyEnv != "") {
			s.keyed = append(s.keyed, keyedClient{model: name, cfg: *e, client: m.engine})
		}
		if name == DefaultKey {
			s.def = m
			continue
		}
		s.models[name] = m
	}
	if s.def != nil {
		s.unlisted = s.def.encoder // a default entry is the operator's word for every model
	} else {
		def, err := s.embeddedDefault(l, deps.DeferDefault)
		if err != nil {
			return nil, err
		}
		s.def, s.unlisted = def, guessed{def.encoder}
	}
	s.locals = slices.Clip(l.order) // a deferred load appends to l.order, not to this
	return s, nil
}

// embeddedDefault loads the embedded default, or defers its load to the first request
// that needs it when asked to and no entry has loaded the same tokenizer already.
func (s *Set) embeddedDefault(l *loader, deferLoad bool) (*model, error) {
	e := Entry{Builtin: DefaultBuiltin}
	name := "builtin:" + DefaultBuiltin
	if _, loaded := l.loaded[name]; !deferLoad || loaded {
		m, err := l.model(DefaultKey, e)
		if err != nil {
			return nil, fmt.Errorf("%s (the embedded default): %w", path(DefaultKey), err)
		}
		return m, nil
	}
	s.deferred = &deferredModel{name: name, log: s.log, load: func() (*model, *local, error) {
		m, err := l.model(DefaultKey, e)
		if err != nil {
			return nil, nil, fmt.Errorf("%s (the embedded default): %w", path(DefaultKey), err)
		}
		return m, l.loaded[name], nil
	}}
	return &model{encoder: s.deferred, source: name}, nil
}

// model loads one entry.
func (l *loader) model(name string, e Entry) (*model, error) {
	loc, err := l.load(name, e, e.Engine == nil && !l.deps.TextOnly)
	if err != nil {
		return nil, err
	}
	option := e.MessagesInlineSystem
	if option == "" {
		option = InlineSystemAuto
	}
	inline := &inlineSystem{model: name, option: option, log: l.deps.Logger}
	if e.Engine == nil {
		pipe := tokenize.Pipeline{Tokenizer: loc.tokenizer, Renderer: loc.renderer, MaxTokens: l.deps.MaxPromptTokens}
		var enc tokenize.PromptEncoder = pipe
		if loc.renderer != nil {
			inline.probe = probeWith(pipe)
			// Inside the inline-system choice: it sees whichever form that picks.
			if e.ExcludeToolsWhenToolChoiceNone {
				enc = toolsExcluded{inner: enc}
			}
			enc = inlineSystemEncoder{inner: enc, mode: inline}
		}
		return &model{encoder: enc, approx: !loc.exact, source: loc.name}, nil
	}
	client, err := engine.New(*e.Engine, name, l.deps.MaxPromptTokens, l.deps.HTTPClient, l.deps.EngineMetrics)
	if err != nil {
		return nil, fmt.Errorf("engine.%w", err)
	}
	m := &model{encoder: client, source: "engine " + e.Engine.URL, engine: client}
	if loc != nil {
		m.encoder = engineChats{engine: client, text: tokenize.Pipeline{Tokenizer: loc.tokenizer, MaxTokens: l.deps.MaxPromptTokens}}
		m.source += " (completions text: " + loc.name + ")"
	}
	m.encoder = inlineSystemEncoder{inner: m.encoder, mode: inline, engine: true}
	return m, nil
}

// ReadAPIKeys reads again the render API keys the config names (api_key_file,
// api_key_env), for a config reload: a rotated Secret is sent from the next render on.
// Nothing changes until apply is called; an error names the key
// (tokenizers.MODEL.engine.api_key_file: …), never quotes a key, and changes nothing.
func (s *Set) ReadAPIKeys() (apply func(), err error) {
	keys := make([]string, len(s.keyed))
	for i, k := range s.keyed {
		if keys[i], err = k.cfg.ReadAPIKey(); err != nil {
			return nil, fmt.Errorf("%s.engine.%w", path(k.model), err)
		}
	}
	return func() {
		for i, k := range s.keyed {
			k.client.SetAPIKey(keys[i])
		}
	}, nil
}

// Model returns the prompt encoder of the named model: its entry's, else the
// default's, logging a warning the first time each model without an entry is seen.
func (s *Set) Model(name string) tokenize.PromptEncoder {
	if m, ok := s.models[name]; ok {
		return m.encoder
	}
	s.warnOnce(name)
	return s.unlisted
}

// guessed encodes a model without an entry with the embedded default, which nobody
// said is its tokenizer: its ids are routed on (right if the model shares it), but
// marked approximate, so that their count is never taken for the engine's (a prompt
// past an engine's context is only certain from its own tokenizer's count).
type guessed struct{ encoder tokenize.PromptEncoder }

func (g guessed) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	enc, err := g.encoder.EncodePrompt(ctx, p)
	enc.Approximate = true
	return enc, err
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

// toolsExcluded encodes a chat whose tool_choice vLLM reads as "none"
// (tokenize.Chat.ToolChoiceNone) without its tools, as a vLLM server started with
// --exclude-tools-when-tool-choice-none renders it (tool_dicts None: the template sees
// no tools, not an empty list). It serves the entries that set
// exclude_tools_when_tool_choice_none; other chats pass as they are.
type toolsExcluded struct{ inner tokenize.PromptEncoder }

func (e toolsExcluded) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	if p.Chat != nil && p.Chat.ToolChoiceNone && p.Chat.Tools != nil {
		c := *p.Chat // the caller's chat is left as it is
		c.Tools = nil
		p.Chat = &c
	}
	return e.inner.EncodePrompt(ctx, p)
}

// engineChats renders chats (and the Responses and Messages bodies vLLM converts to
// chats) on the engine and encodes completions text in process.
type engineChats struct {
	engine tokenize.PromptEncoder
	text   tokenize.Pipeline
}

func (e engineChats) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	if p.Chat != nil || p.BodyAPI == tokenize.APIResponses || p.BodyAPI == tokenize.APIMessages {
		return e.engine.EncodePrompt(ctx, p)
	}
	return e.text.EncodePrompt(ctx, p)
}

// deferredModel is a model loaded by its first EncodePrompt. Concurrent first callers
// wait for the one load; its error, kept, is every call's (an error that is neither
// ErrEngine nor ErrUnsupported: the router routes such a request by load alone).
type deferredModel struct {
	name string // its local's name, known before loading (metrics, logs)
	load func() (*model, *local, error)
	log  *slog.Logger

	once   sync.Once
	model  *model
	err    error
	loaded atomic.Pointer[local] // set once loaded, for the memo metrics
}

func (d *deferredModel) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	d.once.Do(func() {
		start := time.Now()
		// Kept if the load panics (the filter recovers the request): later calls get an
		// error, not a nil model.
		d.err = fmt.Errorf("%s: its load did not finish", d.name)
		var loc *local
		if d.model, loc, d.err = d.load(); d.err != nil {
			d.log.Error("tokenizers: the default tokenizer does not load: requests of models without an entry are routed by load alone",
				"tokenizer", d.name, "error", d.err)
			return
		}
		d.loaded.Store(loc)
		d.log.Info("tokenizers: loaded the default tokenizer for models without an entry", "tokenizer", d.name, "took", time.Since(start))
	})
	if d.err != nil {
		return tokenize.Encoding{}, d.err
	}
	return d.model.encoder.EncodePrompt(ctx, p)
}
