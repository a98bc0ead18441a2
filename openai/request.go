package openai

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// Endpoint is the API a request body is for: tokenize.API, the type the engine
// render client reads its render path from, so the filter's route class and the
// body's API are one value. Its zero value is no API (a path kvroute does not read).
type Endpoint = tokenize.API

// The endpoints kvroute reads the body of: the first two it routes by prompt.
const (
	ChatCompletions = tokenize.APIChat        // /v1/chat/completions: messages
	Completions     = tokenize.APICompletions // /v1/completions: prompt
	// Responses is OpenAI's /v1/responses (ParseResponses): routed on the chat vLLM
	// renders for it (ResponsesChat), or to the worker that stored its
	// previous_response_id. Parse does not read it.
	Responses = tokenize.APIResponses
	// Messages is Anthropic's /v1/messages (ParseMessages), which vLLM serves by
	// converting the body to a chat completion: routed on that chat (MessagesChat).
	// Parse does not read it.
	Messages = tokenize.APIMessages
)

// Limits bound what a body may make the parser do.
type Limits struct {
	// MaxDepth is the deepest nesting of arrays and objects accepted (the top-level
	// object is depth 1); deeper bodies are rejected naming the limit.
	MaxDepth int
	// MaxPromptTokens caps a token-id prompt; longer ones are rejected.
	MaxPromptTokens int
}

// DefaultLimits are the limits of kvroute's defaults (max_json_depth,
// max_prompt_tokens).
func DefaultLimits() Limits { return Limits{MaxDepth: 128, MaxPromptTokens: 1 << 20} }

// The values Parse materialises from one body (a chat's messages, tools, documents and
// chat_template_kwargs, and any array or object given to a scalar field) take at most
// valueBytesPerBodyByte bytes per byte of body, plus valueBytesFloor: 16 bytes per JSON
// value (an array element, a member name, a member value) and the bytes of their
// texts. The scalar fields' texts come on top, no longer than their bytes of the body. A chat body of real
// messages and tools takes 1–3 bytes per byte; one of tiny values (`[0,0,0,…]`, a
// million `{}` tools) would take up to 8, and so many values per byte also cost the
// renderers a multiple of that. Such a chat is not read, but routed by load alone
// (tokenize.Chat.Unread); the engine, which reads the body itself, still judges it.
const (
	valueBytesPerBodyByte = 4
	valueBytesFloor       = 64 << 10
)

// errChatUnread is the tokenize.Chat.Unread of a chat whose values pass the budget.
var errChatUnread = fmt.Errorf("openai: the chat's messages, tools, documents and chat_template_kwargs were not read: "+
	"their values would take more than %d bytes per byte of the request body", valueBytesPerBodyByte)

// Request is what routing needs of an OpenAI request body.
type Request struct {
	Model string
	// CacheSalt is the request's cache_salt (vLLM): its blocks live in their own namespace.
	CacheSalt string
	// LoRA is the adapter a body names apart from its model (an SGLang body's
	// lora_path), "" for none: its blocks live in the adapter's namespace, on Model's
	// workers.
	LoRA   string
	Stream bool
	// Exactly one of Chat (chat completions), Tokens (a token-id completions prompt) and
	// Prompt (a text completions prompt, possibly empty) carries the prompt.
	Chat   *tokenize.Chat
	Tokens []uint32
	Prompt string
	// AddSpecialTokens is the request's add_special_tokens (vLLM): whether the
	// tokenizer's special tokens (a BOS) are added to the prompt's ids. nil when absent:
	// the endpoint's default (added to a completions text, not to a rendered chat).
	AddSpecialTokens *bool
	// Unsupported, when set, is why the prompt the engine serves is not one kvroute can
	// compute although the engine may serve the request (a completions request's
	// prompt_embeds or suffix): it is routed by load. It wraps tokenize.ErrUnsupported.
	Unsupported error
	// TruncatePromptTokens is the request's truncate_prompt_tokens (vLLM, ≥ -1): the
	// engine keeps that many of the prompt's tokens (-1: max_model_len). nil when absent.
	TruncatePromptTokens *int64
	// Sequences is how many sequences the engine runs for the request, when more than
	// one: its parallel samples (n) times the prompts of its batch, each of which vLLM
	// and SGLang run as a request of its own, sharing the prompt's blocks. 0 or 1 is
	// one. At most MaxSequences.
	Sequences int
	// SGLangSession, when not empty, names the SGLang session the request continues (an
	// SGLang /generate body's session_params.id) or closes (a /close_session body's
	// session_id): the engine that opened the session holds it in memory, and every
	// other engine aborts the request.
	SGLangSession string
	// SessionKey, when not empty, is the session the body names as its identity (an
	// SGLang /generate body's session_id, which leaves the prompt as it is): a key for
	// session affinity, as a session header's value is, not state an engine holds.
	SessionKey string
	// MaxTokens is the request's bound on its output tokens as vLLM reads it: a chat's
	// max_completion_tokens when given, else its max_tokens; a completions request's
	// max_tokens, 16 when absent (vLLM's default). 0 when a chat gives none (or null, or
	// 0): the engine's default, which it fits to the context. vLLM refuses a prompt
	// whose tokens plus the bound pass its context.
	MaxTokens int64
}

// MaxSequences bounds Request.Sequences: a body asking for more parallel samples or
// batch prompts than any engine runs at once (vLLM's max_num_seqs is at most a few
// thousand) counts as this many, so that a hostile n cannot swell a worker's load.
const MaxSequences = 4096

// sequencesOf is a request's Request.Sequences: n parallel samples (a value that is
// not an integer of at least 1 counts as one: the engine judges it) of each of
// prompts, at most MaxSequences; 0 for one.
func sequencesOf(n jsonv.Value, prompts int) int {
	samples, ok := laxInt(n)
	if !ok || samples < 1 {
		samples = 1
	}
	// Each factor is at most MaxSequences first, so the product cannot overflow.
	sequences := min(min(samples, MaxSequences)*int64(min(max(prompts, 1), MaxSequences)), MaxSequences)
	if sequences == 1 {
		return 0
	}
	return int(sequences)
}

// completionsDefaultMaxTokens is vLLM's (and OpenAI's) max_tokens of a completions
// request that does not give one.
const completionsDefaultMaxTokens = 16

// Parse reads a request body for endpoint (ChatCompletions, Completions, Generate,
// which ParseGenerate reads, SGLangGenerate, which ParseSGLangGenerate reads, or
// SGLangOpenSession and SGLangCloseSession, which ParseSGLangSessionControl reads).
// Unknown fields are skipped (their syntax is still checked); for a field given twice,
// the last one counts, as in the engines' Python JSON parsing.
func Parse(endpoint Endpoint, body []byte, lim Limits) (Request, error) {
	switch endpoint {
	case Generate:
		return ParseGenerate(body, lim)
	case SGLangGenerate:
		return ParseSGLangGenerate(body, lim)
	case SGLangOpenSession, SGLangCloseSession:
		return ParseSGLangSessionControl(body, lim)
	}
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return Request{}, err
	}
	dec.SetValueBudget(valueBytesPerBodyByte*len(body) + valueBytesFloor)
	var out Request
	// Scalars are kept as values and checked once the body is read, so a later
	// duplicate overrides an earlier one before anything is judged.
	var model, stream, salt, maxTokens, maxCompletion, addSpecial, truncate, addGen, cont, effort, template, samples jsonv.Value
	var messages, tools, documents, kwargs chatField
	var toolChoice toolChoiceField
	var prompt promptField
	var embeds bool         // a completions request's prompt_embeds, not null nor an empty list
	var embedsErr error     // what is wrong with the prompt_embeds given, judged once the body is read
	var maxTokensGiven bool // max_tokens present, even as null
	var suffix jsonv.Value
	err = readObject(dec, lim, func(key string) error {
		var err error
		switch {
		case key == "model":
			model, err = scalarField(dec)
		case key == "stream":
			stream, err = scalarField(dec)
		case key == "cache_salt":
			salt, err = scalarField(dec)
		case key == "max_tokens":
			maxTokensGiven = true
			maxTokens, err = scalarField(dec)
		case key == "max_completion_tokens":
			maxCompletion, err = scalarField(dec)
		case key == "n":
			samples, err = scalarField(dec)
		case key == "add_special_tokens":
			addSpecial, err = scalarField(dec)
		case key == "truncate_prompt_tokens":
			truncate, err = scalarField(dec)
		case key == "messages" && endpoint == ChatCompletions:
			messages, err = readChatField(dec)
		case key == "tools" && endpoint == ChatCompletions:
			tools, err = readChatField(dec)
		case key == "tool_choice" && endpoint == ChatCompletions:
			toolChoice, err = readToolChoice(dec, body)
		case key == "documents" && endpoint == ChatCompletions:
			documents, err = readChatField(dec)
		case key == "chat_template_kwargs" && endpoint == ChatCompletions:
			kwargs, err = readChatField(dec)
		case key == "add_generation_prompt" && endpoint == ChatCompletions:
			addGen, err = scalarField(dec)
		case key == "continue_final_message" && endpoint == ChatCompletions:
			cont, err = scalarField(dec)
		case key == "reasoning_effort" && endpoint == ChatCompletions:
			effort, err = scalarField(dec)
		case key == "chat_template" && endpoint == ChatCompletions:
			template, err = scalarField(dec)
		case key == "prompt" && endpoint == Completions:
			prompt, err = readPrompt(dec, lim)
		case key == "prompt_embeds" && endpoint == Completions:
			embeds, embedsErr, err = readEmbeds(dec)
		case key == "suffix" && endpoint == Completions:
			suffix, err = scalarField(dec)
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return Request{}, err
	}

	if out.Model, err = modelOf(model); err != nil {
		return Request{}, err
	}
	if out.Stream, err = optionalBool(stream, "stream", false); err != nil {
		return Request{}, err
	}
	if !addSpecial.IsNull() {
		add, err := optionalBool(addSpecial, "add_special_tokens", false)
		if err != nil {
			return Request{}, err
		}
		out.AddSpecialTokens = &add
	}
	if !truncate.IsNull() {
		n, ok := laxInt(truncate)
		if !ok || n < -1 {
			return Request{}, badField("truncate_prompt_tokens", "'truncate_prompt_tokens' must be an integer ≥ -1")
		}
		out.TruncatePromptTokens = &n
	}
	if out.CacheSalt, err = cacheSaltOf(salt); err != nil {
		return Request{}, err
	}
	for _, f := range []struct {
		name string
		v    jsonv.Value
	}{{"max_tokens", maxTokens}, {"max_completion_tokens", maxCompletion}} {
		if n, ok := laxInt(f.v); !f.v.IsNull() && (!ok || n < 0) {
			return Request{}, badField(f.name, "'%s' must be a non-negative integer", f.name)
		}
	}
	// vLLM's chat takes max_completion_tokens when it is given (not null), else
	// max_tokens; its completions have max_tokens alone.
	bound := maxTokens
	if endpoint == ChatCompletions && !maxCompletion.IsNull() {
		bound = maxCompletion
	}
	if !bound.IsNull() {
		out.MaxTokens, _ = laxInt(bound)
	} else if endpoint == Completions && !maxTokensGiven {
		// vLLM's completions default max_tokens to 16 (OpenAI's default), checked
		// against the context beside the prompt like a given one (CompletionRequest,
		// build_tok_params); an explicit null is no bound.
		out.MaxTokens = completionsDefaultMaxTokens
	}
	out.Sequences = sequencesOf(samples, prompt.count)
	switch endpoint {
	case ChatCompletions:
		if out.Chat, err = readChat(messages, tools, documents, kwargs, addGen, cont, effort); err == nil {
			out.Chat.ToolChoiceNone = chatToolChoiceNone(toolChoice, tools)
			err = ownTemplate(out.Chat, template)
		}
	case Completions:
		out.Tokens, out.Prompt, err = prompt.ids, prompt.text, prompt.err
		switch {
		case err != nil:
		case embedsErr != nil:
			err = embedsErr
		case suffix.Kind() != jsonv.Null && suffix.Kind() != jsonv.String:
			err = badField("suffix", "'suffix' must be a string")
		case embeds:
			out.Unsupported = errPromptEmbeds
		case !prompt.seen:
			err = badField("prompt", "'prompt' is required: a string, an array of strings, or token ids")
		case !suffix.IsNull():
			out.Unsupported = errSuffix
		}
	default:
		err = fmt.Errorf("openai: unknown endpoint %d", endpoint)
	}
	if err != nil {
		return Request{}, err
	}
	return out, nil
}

// ParseModel reads a request body's model alone: the body's syntax is checked as Parse
// checks it (the same errors), but no other field is kept or judged, so it allocates
// next to nothing whatever the body holds. It is what a body routed by load alone
// needs (the filter's bound on bodies decoded at once).
func ParseModel(body []byte, lim Limits) (string, error) {
	model, err := readModel(body, lim)
	if err != nil {
		return "", err
	}
	return modelOf(model)
}

// ParseGenerateModel is ParseModel for a generate body (ParseGenerate), whose model is
// optional: absent, null or "" is "", the engine's served model.
func ParseGenerateModel(body []byte, lim Limits) (string, error) {
	model, err := readModel(body, lim)
	if err != nil {
		return "", err
	}
	return generateModelOf(model)
}

// readModel reads a body's model member, checking the body's syntax (ParseModel).
func readModel(body []byte, lim Limits) (jsonv.Value, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return jsonv.Value{}, err
	}
	var model jsonv.Value
	err = readObject(dec, lim, func(key string) error {
		if key != "model" {
			return dec.Skip()
		}
		var err error
		model, err = scalarField(dec)
		return err
	})
	if err != nil {
		return jsonv.Value{}, err
	}
	return model, nil
}

// SetModel returns body with the value of its top-level "model" member replaced by
// model, as a JSON string; every other byte is body's, in order. The body is checked as
// ParseModel checks it (the same errors), and a body without the member, or giving it
// more than once, is the client's 400: each copy would take model, and a body of many
// short copies would grow hundreds of times over (a 512-byte name is up to 3,074 bytes
// of JSON), so the result is at most body and one model longer. body is not modified.
func SetModel(body []byte, model string, lim Limits) ([]byte, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return nil, err
	}
	start, end, copies := 0, 0, 0 // the model value's bytes, and how many the body gives
	err = readObject(dec, lim, func(key string) error {
		if key != "model" {
			return dec.Skip()
		}
		if _, err := dec.Peek(); err != nil {
			return err
		}
		start = dec.Offset()
		if err := dec.Skip(); err != nil {
			return err
		}
		end, copies = dec.Offset(), copies+1
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case copies == 0:
		return nil, badField("model", "'model' is required")
	case copies > 1:
		return nil, badField("model", "'model' is given more than once")
	}
	value, err := json.Marshal(model)
	if err != nil { // a string always marshals (invalid UTF-8 is replaced)
		return nil, err
	}
	out := make([]byte, 0, len(body)+len(value)-(end-start))
	out = append(append(append(out, body[:start]...), value...), body[end:]...)
	return out, nil
}

// objectDecoder returns a decoder of body, which must be a JSON object: an empty body,
// or one that opens another value, is the client's 400. A UTF-8 byte order mark before
// the object is skipped, and NaN, Infinity and -Infinity are numbers: the engines'
// FastAPI servers read a body with Python's json.loads of its bytes, which drops the
// mark (offsets stay body's) and reads those words as floats, which pydantic's float
// and Any fields take (its int and bool fields refuse them, and so does laxInt).
func objectDecoder(body []byte, lim Limits) (*jsonv.Decoder, error) {
	if len(body) == 0 {
		return nil, badField("", "request body is empty: expected a JSON object")
	}
	dec := jsonv.NewDecoder(body, lim.MaxDepth)
	dec.SkipByteOrderMark()
	dec.AcceptNonFinite()
	if k, err := dec.Peek(); err != nil {
		return nil, syntaxError(err, lim)
	} else if k != jsonv.Object {
		return nil, badField("", "request body must be a JSON object")
	}
	return dec, nil
}

// cacheSaltOf reads a cache_salt value (vLLM): a non-empty string, or null or absent
// (""). vLLM refuses the empty string on every API that takes a salt (the chat and
// completions requests' min_length=1 and check_cache_salt_support, the Responses
// request's check_cache_salt_support, and the chat an Anthropic Messages body becomes).
func cacheSaltOf(salt jsonv.Value) (string, error) {
	switch {
	case salt.Kind() == jsonv.Null:
		return "", nil
	case salt.Kind() == jsonv.String && salt.Str() != "":
		return salt.Str(), nil
	}
	return "", badField("cache_salt", "'cache_salt' must be a string, and not empty")
}

// modelOf reads the model field's value: a non-empty string.
func modelOf(model jsonv.Value) (string, error) {
	if model.Kind() != jsonv.String || model.Str() == "" {
		return "", badField("model", "'model' is required and must be a non-empty string")
	}
	return model.Str(), nil
}

// errOwnTemplate is the tokenize.Chat.Unread of a chat that names its own template.
var errOwnTemplate = fmt.Errorf("%w: the request names its own chat_template, which the engine renders it with "+
	"(--trust-request-chat-template) or refuses it for", tokenize.ErrUnsupported)

// ownTemplate marks a chat that names its own Jinja template, a string chat_template or
// a chat_template in its chat_template_kwargs (not null), as one the in-process
// renderers do not render (Unread): vLLM renders it with that template when the server
// trusts request templates, and refuses it otherwise (online_renderer.py
// validate_chat_template; build_chat_params takes the request's template over the
// server's). Either way the model's template is not the one, so the request is routed by
// load; an encoder that asks the engine, which reads the body itself, still renders it.
// A chat_template that is neither a string nor null is the client's 400.
func ownTemplate(chat *tokenize.Chat, template jsonv.Value) error {
	switch template.Kind() {
	case jsonv.Null, jsonv.String:
	default:
		return badField("chat_template", "'chat_template' must be a string")
	}
	var inKwargs jsonv.Value // the last one, as Python's dict keeps it
	for i := range chat.TemplateKwargs.Len() {
		if k, v := chat.TemplateKwargs.Member(i); k == "chat_template" {
			inKwargs = v
		}
	}
	if (!template.IsNull() || !inKwargs.IsNull()) && chat.Unread == nil {
		chat.Unread = errOwnTemplate
	}
	return nil
}

// scalarField reads the value of a field that takes a scalar. A scalar is read outside
// the value budget (its text is no longer than its bytes of the body), so that the
// chat fields before it, which may have taken nearly all of the budget, cannot make a
// valid request a 400. An array or an object is read within the budget, and no such
// field takes one: a value over the budget is read as an empty array, which gets the
// field's own error.
func scalarField(dec *jsonv.Decoder) (jsonv.Value, error) {
	if k, err := dec.Peek(); err == nil && k != jsonv.Array && k != jsonv.Object {
		return dec.Scalar()
	}
	v, err := dec.Value()
	if errors.Is(err, jsonv.ErrOverBudget) {
		return jsonv.ArrayValue(), nil
	}
	return v, err
}

// chatField is the value of a field the chat template reads, or unread when it was
// over the value budget (and so not materialised).
type chatField struct {
	v      jsonv.Value
	unread bool
}

func readChatField(dec *jsonv.Decoder) (chatField, error) {
	v, err := dec.Value()
	if errors.Is(err, jsonv.ErrOverBudget) {
		return chatField{unread: true}, nil
	}
	return chatField{v: v}, err
}

// toolChoiceField is a request's tool_choice as far as its prompt depends on it: whether
// the field was given, and whether it is the string "none". No other value changes the
// prompt, so none is kept, and none is judged: the engine judges them.
type toolChoiceField struct {
	seen, none bool
}

// readToolChoice reads a tool_choice value from body, which dec reads. The value is
// skipped as any unread field is (the same syntax errors), then a string is decoded
// on its own, escapes and all, as Python compares it.
func readToolChoice(dec *jsonv.Decoder, body []byte) (toolChoiceField, error) {
	k, err := dec.Peek()
	if err != nil {
		return toolChoiceField{}, dec.Skip()
	}
	start := dec.Offset()
	if err := dec.Skip(); err != nil {
		return toolChoiceField{}, err
	}
	tc := toolChoiceField{seen: true}
	if k == jsonv.String {
		s, err := jsonv.NewDecoder(body[start:dec.Offset()], 1).String()
		tc.none = err == nil && s == "none"
	}
	return tc, nil
}

// chatToolChoiceNone reports whether vLLM reads a chat completion's tool_choice as
// "none" (ChatCompletionRequest.check_tool_usage and the field's default): the string
// "none", or no tool_choice and no tools to make it "auto" (absent, null or an empty
// list: Python's falsy data.get("tools")). A null tool_choice is None, not "none".
func chatToolChoiceNone(tc toolChoiceField, tools chatField) bool {
	if tc.seen {
		return tc.none
	}
	return !tools.unread && tools.v.Len() == 0
}

// readObject walks a body's top-level object with fn (jsonv.Decoder.Members) and checks
// that nothing follows it; a fault of the body's syntax or depth is the client's 400
// (syntaxError), and fn's own *FieldError passes through.
func readObject(dec *jsonv.Decoder, lim Limits, fn func(key string) error) error {
	err := dec.Members(fn)
	if err == nil {
		err = dec.End()
	}
	if err != nil {
		return syntaxError(err, lim)
	}
	return nil
}

// syntaxError turns a decoder error into the client's 400, naming the depth limit when
// that is what was hit.
func syntaxError(err error, lim Limits) error {
	if errors.Is(err, jsonv.ErrTooDeep) {
		return badField("", "request body is nested deeper than %d levels (max_json_depth)", lim.MaxDepth)
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return err
	}
	return badField("", "request body is not valid JSON: %v", err)
}

// optionalBool reads a bool field as the engines do (laxBool); null or absent is def.
func optionalBool(v jsonv.Value, name string, def bool) (bool, error) {
	if v.IsNull() {
		return def, nil
	}
	if b, ok := laxBool(v); ok {
		return b, nil
	}
	return false, badField(name, "'%s' must be a boolean", name)
}

// The Request.Unsupported of a completions request whose prompt kvroute cannot compute.
var (
	// vLLM (with --enable-prompt-embeds) serves the embeddings as prompts of the batch,
	// before any text prompt (online_renderer.py preprocess_completion), and their
	// blocks are no tokenizer's ids.
	errPromptEmbeds = fmt.Errorf("%w: the completions request's prompt_embeds are its prompt", tokenize.ErrUnsupported)
	// vLLM refuses a suffix (online_renderer.py render_completion: "suffix is not
	// currently supported"), and an engine that serves one (SGLang's fill-in-the-middle)
	// wraps the prompt in a template of its own.
	errSuffix = fmt.Errorf("%w: the completions request has a suffix, which the engine refuses or renders with a template of its own", tokenize.ErrUnsupported)
)

// readEmbeds reads a completions request's prompt_embeds (vLLM: bytes | list[bytes] |
// None, base64 text): whether there are any, a value neither null nor an empty list
// (validate_prompt_and_prompt_embeds), and, for a value of another type, its
// *FieldError, judged once the body is read (a later prompt_embeds replaces it). The
// value is skipped, never materialised, and its elements are the engine's to judge; err
// is the body's syntax.
func readEmbeds(dec *jsonv.Decoder) (embeds bool, fault, err error) {
	k, err := dec.Peek()
	if err != nil {
		return false, nil, err
	}
	switch k {
	case jsonv.Null:
	case jsonv.String:
		return true, nil, dec.Skip()
	case jsonv.Array:
		_, empty, err := dec.PeekFirst()
		if err != nil {
			return false, nil, err
		}
		return !empty, nil, dec.Skip()
	default:
		return false, badField("prompt_embeds", "'prompt_embeds' must be a base64 string or an array of them"), dec.Skip()
	}
	return false, nil, dec.Skip()
}

// promptField is a completions prompt as read, judged once the body is read.
type promptField struct {
	seen bool
	text string
	ids  []uint32
	err  error
	// count is the prompts a batch holds (each an engine request of its own); 0 for a
	// single prompt.
	count int
}

// readPrompt reads a completions prompt: a string, an array of token ids, or a batch of
// either. A batch is routed by its first prompt: the engine serves the batch on one
// worker, and the first prompt is the one whose prefix is most likely shared. The rest
// of a batch is only syntax-checked.
//
// vLLM's prompt is list[int] | list[list[int]] | str | list[str], which pydantic
// resolves in smart mode: a member the value matches strictly (an array of strings is
// list[str]), else the first member it matches in lax mode. So an array holding anything
// but strings is token ids, each read as pydantic's lax int does (laxTokenID): [1.0, 2],
// [1e2, 7], [true, 2] and ["1", 2] are the ids [1 2], [100 7], [1 2] and [1 2].
func readPrompt(dec *jsonv.Decoder, lim Limits) (promptField, error) {
	p := promptField{seen: true}
	k, err := dec.Peek()
	if err != nil {
		return p, err
	}
	if k == jsonv.Null { // vLLM's prompt may be None: as if absent
		return promptField{}, dec.Skip()
	}
	if k == jsonv.String {
		p.text, err = dec.String()
		return p, err
	}
	first, empty, err := dec.PeekFirst()
	switch {
	case err != nil:
		p.err = badField("prompt", "'prompt' must be a string, an array of strings, or token ids")
		return p, dec.Skip()
	case empty:
		p.err = badField("prompt", "'prompt' must not be an empty array")
		return p, dec.Skip()
	case first == jsonv.Number || first == jsonv.True || first == jsonv.False:
		return p, p.idsField(dec, lim, "prompt")
	case first == jsonv.String:
		if texts, err := dec.EveryElementIs(jsonv.String); err != nil {
			return p, err
		} else if !texts {
			return p, p.idsField(dec, lim, "prompt")
		}
	}
	err = dec.Elements(func(i int) error {
		p.count = i + 1
		switch {
		case i > 0:
			return dec.Skip()
		case first == jsonv.String:
			p.text, err = dec.String()
			return err
		case first == jsonv.Array:
			return p.idsField(dec, lim, "prompt")
		}
		p.err = badField("prompt", "'prompt' must be a string, an array of strings, or token ids")
		return dec.Skip()
	})
	return p, err
}

// idsArray reads an array of token ids, at most lim.MaxPromptTokens of them; param names
// the field in its faults. The array is consumed whole unless it is malformed: its
// fault, if any, is a *FieldError, judged once the body is read (a later prompt
// replaces it, as in Python); any other error is the body's syntax.
func idsArray(dec *jsonv.Decoder, lim Limits, param string) ([]uint32, error) {
	ids, err := dec.AppendUint32sFunc(nil, lim.MaxPromptTokens, laxTokenID)
	switch {
	case errors.Is(err, jsonv.ErrTooMany):
		return nil, badField(param, "the prompt has more than %d token ids (max_prompt_tokens)", lim.MaxPromptTokens)
	case errors.Is(err, jsonv.ErrNotUint32):
		return nil, badField(param, "token ids must be integers in [0, 2^32): %v", err)
	case err != nil:
		return nil, err
	case len(ids) == 0:
		return nil, badField(param, "a token-id prompt must not be empty")
	}
	return ids, nil
}

// idsField reads an array of token ids into p (idsArray; param names the field): a
// fault of the ids is p's, to be judged once the body is read; the error returned is
// the body's syntax.
func (p *promptField) idsField(dec *jsonv.Decoder, lim Limits, param string) error {
	p.ids, p.err = idsArray(dec, lim, param)
	var fe *FieldError
	if p.err != nil && !errors.As(p.err, &fe) {
		return p.err
	}
	return nil
}
