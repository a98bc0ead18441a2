package template

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

var (
	// ErrTemplate is wrapped by the error of a render the template itself refused with
	// raise_exception (roles that do not alternate, a tool message with no call…). vLLM
	// answers such a request with 400; so should the caller.
	// It wraps [tokenize.ErrRefused].
	ErrTemplate error = &classError{"chat template refused the chat", tokenize.ErrRefused}
	// ErrUnsupportedContent is wrapped by the error for a chat this renderer cannot
	// reproduce: media content parts (image, audio, video), whose placeholders and token
	// expansion are the model processor's. The request may still be valid for the engine.
	// It wraps [tokenize.ErrUnsupported].
	ErrUnsupportedContent error = &classError{"chat content not supported by the template renderer", tokenize.ErrUnsupported}
	// ErrOutputTooLarge is wrapped by the error for a prompt longer than the renderer's
	// MaxOutputBytes, for a render whose tojson calls would print more than that in
	// total (refused before the output is built), and for a chat whose values would take
	// more than 32 MiB as the Jinja library's values (refused before any is converted).
	ErrOutputTooLarge = errors.New("rendered prompt too large")
	// ErrRenderTooSlow is wrapped by the error of a render through the Jinja library
	// still running at the renderer's MaxRenderTime: it stops at the next iteration of
	// any of the template's loops.
	ErrRenderTooSlow = errors.New("chat template render took too long")
	// ErrRender is wrapped by every other render failure: a template error (an undefined
	// call, a type error) or a panic inside the Jinja library, turned into an error.
	ErrRender = errors.New("chat template render failed")
)

// classError is a sentinel error of this package that belongs to one of the classes
// package tokenize declares, so callers can map it without knowing this package.
type classError struct {
	msg   string
	class error
}

func (e *classError) Error() string { return e.msg }
func (e *classError) Unwrap() error { return e.class }

// DefaultMaxOutputBytes caps a rendered prompt when Options.MaxOutputBytes is 0.
const DefaultMaxOutputBytes = 16 << 20

// maxRangeItems bounds range(): no chat template needs more, and a template handed a
// hostile number must not allocate without bound.
const maxRangeItems = 1 << 20

// ContentFormat is how message content reaches the template (vLLM's
// --chat-template-content-format).
type ContentFormat string

// The content formats. The empty ContentFormat means detect, as vLLM's "auto" does.
const (
	// ContentString joins a message's text parts with "\n" into one string.
	ContentString ContentFormat = "string"
	// ContentOpenAI keeps content a list of {"type": "text", "text": …} parts.
	ContentOpenAI ContentFormat = "openai"
)

// Tokens are the special tokens a template sees as variables, as transformers' special
// tokens map gives them.
type Tokens struct {
	// Named maps a special token's name (bos_token, eos_token, unk_token, sep_token,
	// pad_token, cls_token, mask_token) to its text. Absent names are undefined.
	Named map[string]string
	// Additional is additional_special_tokens; absent from the template when empty.
	Additional []string
}

// Options tune a Renderer. The zero value is ready to use.
type Options struct {
	// Now is the clock strftime_now formats; nil means the wall clock. Inject a fixed
	// clock for reproducible prompts of date-stamped templates (Llama 3.1+).
	Now func() time.Time
	// MaxOutputBytes caps a rendered prompt, and the total a render's tojson filters may
	// print (each call is measured before it is built); 0 means DefaultMaxOutputBytes.
	MaxOutputBytes int
	// ContentFormat forces the content format; empty detects it per template, as vLLM.
	ContentFormat ContentFormat
	// MaxRenderTime bounds the wall-clock time of a render through the Jinja library,
	// from the start of its value conversion: past it, the render ends at the next
	// iteration of any loop of the template, with ErrRenderTooSlow. 0 means
	// DefaultMaxRenderTime. The direct renderers, linear and a few ms at most, are not
	// bounded.
	MaxRenderTime time.Duration
}

// Renderer renders chats with a model's Jinja chat template. It implements
// [tokenize.ChatRenderer]; it is immutable but for its render counts, and safe for
// concurrent use.
type Renderer struct {
	// templates are keyed by name; a single template is "default".
	templates map[string]*compiled
	tokens    Tokens
	now       func() time.Time
	maxOutput int
	counts    *renderCounts
	// maxTime is MaxRenderTime, clock what measures it (time.Now; tests' own).
	maxTime time.Duration
	clock   func() time.Time
}

// renderCounts count renders by the way they were made.
type renderCounts struct{ direct, library atomic.Uint64 }

// RenderStats count a Renderer's renders by the way they were made, for metrics.
type RenderStats struct {
	// Direct counts the chats a direct renderer rendered, Library those rendered
	// through the Jinja library (a template with no direct renderer, or a chat its
	// direct renderer does not take). Renders that failed are counted too.
	Direct, Library uint64
}

// Stats returns the render counts.
func (r *Renderer) Stats() RenderStats {
	return RenderStats{Direct: r.counts.direct.Load(), Library: r.counts.library.Load()}
}

var _ tokenize.ChatRenderer = (*Renderer)(nil)

// compiled is one parsed template and how it wants message content.
type compiled struct {
	name   string
	tmpl   *jinja.Template
	format ContentFormat
	// direct, when set, renders the chats it handles without the library
	// (directRenderers); it is only used with the string content format.
	direct directRenderer
}

// DefaultTemplate and ToolUseTemplate name the templates transformers picks among a
// tokenizer's named templates: tool_use when the request has tools and it exists, else
// default.
const (
	DefaultTemplate = "default"
	ToolUseTemplate = "tool_use"
)

// New compiles a single chat template.
func New(source string, tokens Tokens, opts Options) (*Renderer, error) {
	return NewNamed(map[string]string{DefaultTemplate: source}, tokens, opts)
}

// NewNamed compiles a set of named chat templates, which must include "default".
func NewNamed(sources map[string]string, tokens Tokens, opts Options) (*Renderer, error) {
	if _, ok := sources[DefaultTemplate]; !ok {
		return nil, fmt.Errorf("template: no %q chat template among %q", DefaultTemplate, slices.Sorted(maps.Keys(sources)))
	}
	switch opts.ContentFormat {
	case "", ContentString, ContentOpenAI:
	default:
		return nil, fmt.Errorf("template: content format %q: want %q or %q", opts.ContentFormat, ContentString, ContentOpenAI)
	}
	if opts.MaxOutputBytes < 0 {
		return nil, fmt.Errorf("template: MaxOutputBytes %d: must be ≥ 0", opts.MaxOutputBytes)
	}
	if opts.MaxRenderTime < 0 {
		return nil, fmt.Errorf("template: MaxRenderTime %s: must be ≥ 0", opts.MaxRenderTime)
	}
	r := &Renderer{templates: make(map[string]*compiled, len(sources)), tokens: tokens, now: opts.Now,
		maxOutput: opts.MaxOutputBytes, counts: new(renderCounts), maxTime: opts.MaxRenderTime, clock: time.Now}
	if r.maxTime == 0 {
		r.maxTime = DefaultMaxRenderTime
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.maxOutput == 0 {
		r.maxOutput = DefaultMaxOutputBytes
	}
	for name, src := range sources {
		t, err := compile(src)
		if err != nil {
			return nil, fmt.Errorf("template: compile chat template %q: %w", name, err)
		}
		format := opts.ContentFormat
		if format == "" {
			format = DetectContentFormat(src)
		}
		r.templates[name] = &compiled{name: name, tmpl: t, format: format, direct: directRendererFor(src, directEnv{tokens: tokens, now: r.now})}
	}
	return r, nil
}

// compile parses a template with its whitespace resolved as Jinja2 does and its tojson
// filters bound to the render's budget (bindTojson), turning a panic of the parser into
// an error.
func compile(src string) (*jinja.Template, error) { return compileSource(src, true) }

// compileSource is compile, binding the tojson filters or not (the library's own, for
// tests that compare the two).
func compileSource(src string, bind bool) (t *jinja.Template, err error) {
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("parser panicked: %v", p)
		}
	}()
	resolved, err := resolveWhitespace(src, bind)
	if err != nil {
		return nil, err
	}
	return jinja.Compile(resolved)
}

// ContentFormat reports the content format the named template renders with, and
// whether there is such a template.
func (r *Renderer) ContentFormat(name string) (ContentFormat, bool) {
	c, ok := r.templates[name]
	if !ok {
		return "", false
	}
	return c.format, true
}

// pick chooses the template as transformers does for a request with or without tools.
func (r *Renderer) pick(hasTools bool) *compiled {
	if hasTools {
		if c, ok := r.templates[ToolUseTemplate]; ok {
			return c
		}
	}
	return r.templates[DefaultTemplate]
}

// Render implements [tokenize.ChatRenderer]: the prompt vLLM renders for chat.
func (r *Renderer) Render(chat *tokenize.Chat) (string, error) {
	out, err := r.AppendRender(nil, chat)
	if err != nil {
		return "", err
	}
	// out is this call's own buffer, never written again: the string can share it.
	return unsafe.String(unsafe.SliceData(out), len(out)), nil
}

// AppendRender implements [tokenize.AppendRenderer]: it appends Render's prompt to dst,
// so a caller that reuses its buffer renders without allocating one.
func (r *Renderer) AppendRender(dst []byte, chat *tokenize.Chat) ([]byte, error) {
	if chat != nil && chat.Unread != nil {
		return nil, chat.Unread
	}
	if chat == nil || len(chat.Messages) == 0 {
		return nil, tokenize.ErrNoMessages
	}
	c := r.pick(chat.Tools != nil)
	if c.direct != nil && c.format == ContentString {
		if out, final, ok := c.direct(dst, chat); ok {
			r.counts.direct.Add(1)
			if chat.AddGenerationPrompt && chat.ContinueFinalMessage {
				return nil, errBothGenerationAndContinue
			}
			rendered := out[len(dst):]
			prompt, err := r.finish(unsafe.String(unsafe.SliceData(rendered), len(rendered)), final, chat.ContinueFinalMessage)
			if err != nil {
				return nil, err
			}
			return out[:len(dst)+len(prompt)], nil // finish returns a prefix of its input
		}
	}
	r.counts.library.Add(1)
	clock := &timeBudget{deadline: r.clock().Add(r.maxTime), now: r.clock}
	if cost := convertedCost(chat, c.format, maxConvertedBytes); cost > maxConvertedBytes {
		return nil, fmt.Errorf("%w: the chat's values would take more than %d bytes as template values (limit %d)", ErrOutputTooLarge, cost, maxConvertedBytes)
	}
	messages, final, err := conversation(chat.Messages, c.format)
	if err != nil {
		return nil, err
	}
	data := make(map[string]jinja.Value, 16)
	r.addTokens(data)
	raised := r.addGlobals(data)
	data["messages"] = jinja.NewList(messages)
	data["tools"] = jinja.None()
	if chat.Tools != nil {
		data["tools"] = toolsValue(chat.Tools)
	}
	data["documents"] = jinja.None()
	if chat.Documents != nil {
		data["documents"] = listValue(chat.Documents)
	}
	data["add_generation_prompt"] = jinja.NewBool(chat.AddGenerationPrompt)
	cont := chat.ContinueFinalMessage
	if err = mergeKwargs(data, chat.TemplateKwargs, chat.Documents != nil); err != nil {
		return nil, err
	}
	if chat.AddGenerationPrompt && cont {
		return nil, errBothGenerationAndContinue
	}
	// Bound after the kwargs, which cannot displace them.
	budget := &jsonBudget{left: r.maxOutput}
	budget.bind(data)
	clock.bind(data)
	out, err := execute(c.tmpl, data)
	if clock.exceeded {
		return nil, fmt.Errorf("%w: template %q stopped after %s (limit %s)", ErrRenderTooSlow, c.name, r.maxTime-clock.deadline.Sub(r.clock()), r.maxTime)
	}
	if raised.ok {
		return nil, fmt.Errorf("%w: %s", ErrTemplate, raised.msg)
	}
	if budget.exceeded {
		return nil, fmt.Errorf("%w: tojson would print %d bytes, %d left of the limit of %d", ErrOutputTooLarge, budget.need, budget.left, r.maxOutput)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: template %q: %v", ErrRender, c.name, err)
	}
	prompt, err := r.finish(out, final, cont)
	if err != nil {
		return nil, err
	}
	return append(dst, prompt...), nil
}

var errBothGenerationAndContinue = fmt.Errorf("%w: continue_final_message and add_generation_prompt cannot both be true", ErrRender)

// finish checks a rendered prompt's size and cuts it after the final message's text
// when continuing it.
func (r *Renderer) finish(out string, final finalText, cont bool) (string, error) {
	if len(out) > r.maxOutput {
		return "", fmt.Errorf("%w: %d bytes, limit %d", ErrOutputTooLarge, len(out), r.maxOutput)
	}
	if cont {
		return continueFinal(out, final)
	}
	return out, nil
}

// addTokens sets the special tokens, as transformers' special tokens map passes them.
func (r *Renderer) addTokens(data map[string]jinja.Value) {
	for name, text := range r.tokens.Named {
		data[name] = jinja.NewString(text)
	}
	if len(r.tokens.Additional) > 0 {
		items := make([]jinja.Value, len(r.tokens.Additional))
		for i, s := range r.tokens.Additional {
			items[i] = jinja.NewString(s)
		}
		data["additional_special_tokens"] = jinja.NewList(items)
	}
}

// raisedMessage records a raise_exception call of one render.
type raisedMessage struct {
	msg string
	ok  bool
}

// addGlobals sets this render's raise_exception, strftime_now and range, which shadow
// the library's: raise_exception records its message (the library's error text does
// not keep the call apart from other failures), strftime_now reads the injected clock
// and range is bounded.
func (r *Renderer) addGlobals(data map[string]jinja.Value) *raisedMessage {
	raised := &raisedMessage{}
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		raised.msg, raised.ok = "raise_exception called", true
		if len(args) > 0 && args[0].IsString() {
			raised.msg = args[0].AsString()
		} else if len(args) > 0 {
			raised.msg = args[0].String()
		}
		return jinja.Undefined(), errors.New(raised.msg)
	})
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now: expected one format string")
		}
		return jinja.NewString(strftime(r.now(), args[0].AsString())), nil
	})
	data["range"] = jinja.NewCallable("range", boundedRange)
	return raised
}

// execute renders, turning a panic inside the library into an error.
func execute(t *jinja.Template, data map[string]jinja.Value) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("panic: %v", p)
		}
	}()
	return t.RenderValues(data)
}

// mergeKwargs applies chat_template_kwargs over the template variables as the newest
// vLLM does (vllm/entrypoints/openai/chat_completion/protocol.py build_chat_params and
// vllm/renderers/params.py merge_kwargs, at 002032ee2b18; online_renderer.py
// preprocess_chat): the request's top-level add_generation_prompt and
// continue_final_message win over the kwargs' (build_chat_params merges them over the
// kwargs, and a bool is never unset), so those two keys are ignored here; its documents
// win when it has them (hasDocuments), the kwargs' documents count only when it has none;
// a kwarg whose value is null or the string "auto" is dropped (merge_kwargs' unset
// values, as with_defaults merges the kwargs over vLLM's defaults), leaving the variable
// as it was; tools, like any other name, may be overridden (vLLM's tools are a default
// under the kwargs). transformers consumes its own parameters and passes the rest
// (special tokens included) to the template. A later duplicate key wins.
func mergeKwargs(data map[string]jinja.Value, kwargs jsonv.Value, hasDocuments bool) error {
	for i := range kwargs.Len() {
		key, v := kwargs.Member(i)
		if unsetKwarg(v) {
			continue
		}
		switch key {
		case "chat_template", "tokenize":
			return fmt.Errorf("%w: chat_template_kwargs may not set %q", ErrRender, key)
		case "messages", "conversation":
			return fmt.Errorf("%w: chat_template_kwargs may not set %q (it is the chat itself)", ErrRender, key)
		case "padding", "truncation", "max_length", "return_tensors", "return_dict",
			"return_assistant_tokens_mask", "tokenizer_kwargs":
			// transformers' own parameters: consumed, never template variables.
		case "add_generation_prompt", "continue_final_message":
			// The request's own fields, always set, win.
		case "documents":
			if !hasDocuments {
				data[key] = toValue(v)
			}
		default:
			data[key] = toValue(v)
		}
	}
	return nil
}

// unsetKwarg reports whether vLLM's merge_kwargs drops a kwarg of value v: null, or the
// string "auto" (its unset_values).
func unsetKwarg(v jsonv.Value) bool {
	return v.Kind() == jsonv.Null || v.Kind() == jsonv.String && v.Str() == "auto"
}

// continueFinal cuts the rendered chat right after the final message's text, as
// transformers does for continue_final_message, so the model continues that message.
func continueFinal(rendered string, final finalText) (string, error) {
	if !final.ok {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text to continue", ErrRender)
	}
	text := final.text
	stripped := pyStrip(text)
	loc := strings.LastIndex(rendered, stripped)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendered chat", ErrRender)
	}
	left := pyLStrip(text)
	if end := loc + len(left); end <= len(rendered) && left == text && rendered[loc:end] == text {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// boundedRange is Python's range() for the template, refusing more than maxRangeItems
// items instead of allocating them.
func boundedRange(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var start, stop, step int64 = 0, 0, 1
	ints := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			ints[i] = a.AsInt()
		case a.IsBool():
			if a.AsBool() {
				ints[i] = 1
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range: %s object cannot be interpreted as an integer", a.String())
		}
	}
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range: step must not be zero")
	}
	var n uint64
	switch {
	case step > 0 && start < stop:
		n = (uint64(stop-start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		n = (uint64(start-stop)-1)/uint64(-step) + 1
	}
	if n > maxRangeItems {
		return jinja.Undefined(), fmt.Errorf("range: %d items exceeds the limit of %d", n, maxRangeItems)
	}
	items := make([]jinja.Value, n)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}
