package openai

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// ErrMessagesNotRendered is wrapped by [MessagesChat]'s errors for bodies whose prompt
// kvroute does not rebuild: the request is then routed by load, not refused (the
// engine, which reads the body itself, judges it). It never wraps [ErrBadRequest].
var ErrMessagesNotRendered = errors.New("openai: the Messages request's prompt is not rebuilt")

func messagesNotRendered(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMessagesNotRendered, fmt.Sprintf(format, args...))
}

// billingHeader opens the system text block Claude Code sends with every request (a
// per-request attribution hash): vLLM drops such blocks so that they do not end the
// prompt's shared prefix at its first message.
const billingHeader = "x-anthropic-billing-header"

// MessagesChat builds the chat vLLM renders for an Anthropic Messages API request body
// (POST /v1/messages): vLLM converts the body into a ChatCompletionRequest and serves
// it as a chat completion, so kvroute's chat renderers and tokenizers route the request
// by its prompt's prefix. The conversion follows vLLM's
// (vllm/entrypoints/anthropic/serving.py to_chat_completion_request, inline_system.py
// and protocol.py at vLLM commit a8c3bdb20f5d, the newest read; older vLLM differs as
// noted):
//
//   - system: a string is kept as is; a list of blocks gives the texts of its non-empty
//     text blocks that do not start with "x-anthropic-billing-header", joined with no
//     separator. The texts of the system messages that lead messages (role "system",
//     an extension Claude Code sends; a string starting with the billing header counts
//     as empty) are joined with "\n\n" and appended after it with "\n\n". The result,
//     when not empty, is a leading system message. Older vLLM kept every system block's
//     text (no billing-header rule) and inline system messages in place;
//   - inline system messages (role "system" after the first user or assistant message;
//     Claude Code appends one on almost every turn) are placed as normalize_inline_system
//     places them, in one of two modes vLLM picks per model (its Messages handler's
//     inline_system option, "auto" by default: a probe of the chat template, which
//     [ProbeInlineSystem] runs): in both, one between an assistant's tool_use and the
//     message after it (the tool results) moves after that message. "preserve" then
//     keeps each as a system message of its text (none when empty), unless the request
//     has no system prompt and no leading system text: it then folds too. "fold" drops
//     those without text and merges the others into a neighbour (rules at
//     normalizeInlineSystem): appended ("\n\n") to the text of the user message just
//     before, or to its last tool result's when it has nothing but tool results; else
//     put before the text of the next user message, or made a user message of their
//     own before the next assistant message or at the end. The chat returned is
//     preserve's; when fold gives another, it is the chat's Folded, for the encoder
//     that knows the model's mode ([tokenize.Chat.Folded]);
//   - a user or assistant message whose content is a string is {"role","content"};
//   - a message of blocks: non-empty text blocks are text parts, thinking blocks
//     (thinking not null) are joined with no separator as reasoning, redacted_thinking
//     and tool_reference blocks add nothing, a tool_use block is a tool call
//     {"id","type":"function","function":{"name","arguments"}} whose arguments are
//     CPython's json.dumps of its input ({} when null or empty: ", " and ": "
//     separators, non-ASCII escaped, the input's key order, numbers as Python prints
//     the int or float it reads). A single text part becomes string content. The message
//     is {"role", "reasoning"?, "tool_calls"?, "content"?}; a user message left without
//     content is dropped (its tool calls too), an assistant message never is;
//   - a tool_result block in a user message is a tool message {"role":"tool",
//     "tool_call_id","content"} placed before the rest of that message (before the
//     message itself): its content is the string, or the texts of its text items
//     joined with "\n" (other items but images and named tool references ignored), or
//     "". In an assistant message it is the text part "Tool result: " and its string
//     content;
//   - tools: each is the function tool {"type":"function","function":{"name",
//     "description","parameters","defer_loading" (only when set),"strict"}} as vLLM's
//     FunctionDefinition dumps it (strict an extra, null when unset); parameters is
//     input_schema with "type":"object" appended when it has no type. No tools gives
//     nil Tools, an empty list an empty one;
//   - output_config.effort is the chat's reasoning_effort; the request's
//     chat_template_kwargs are the chat's. Both reach the template as a chat
//     completion's do (readChat: reasoning_effort and enable_thinking merged);
//   - the generation prompt is always added: vLLM never continues a final assistant
//     message (prefill), it renders it closed.
//
// tool_choice is checked, and {"type":"none"} (vLLM's chat tool_choice "none") sets
// ToolChoiceNone on the chat and on its Folded: vLLM renders the tools whatever it says
// unless the server runs with --exclude-tools-when-tool-choice-none, whose check is in
// the chat rendering the converted request goes through (OnlineRenderer.render_chat),
// and the encoder that knows the model's setting drops them then.
//
// A body rejected as a whole, or for its model, stream, cache_salt or max_tokens, gets
// the *FieldError [ParseMessages] gives it. A body whose prompt kvroute does not
// rebuild gets an error wrapping [ErrMessagesNotRendered]: values vLLM refuses (a field
// of the wrong type, an unknown block type such as document, a message of another
// role, a tool without input_schema such as Anthropic's server tools); images (in
// messages or tool results), named tool references in tool results, a tool_use without
// an id (vLLM makes one up from the clock), a tool_result of block content in an
// assistant message (vLLM renders Python's repr of it), tool_use input numbers Python
// would not print back as kvroute reads them (beyond float64, or ints of more than
// 4300 digits); thinking {"type":"disabled"}, which vLLM maps by probing the chat
// template it serves; a body with no message; and a body whose values would take more
// than the memory Parse allows a chat (4 bytes per byte of body, and as much again for
// the chat built from them, or for the two chats of a body with inline system
// messages).
func MessagesChat(body []byte, lim Limits) (*tokenize.Chat, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return nil, err
	}
	budget := valueBytesPerBodyByte*len(body) + valueBytesFloor
	dec.SetValueBudget(budget)
	var fields messagesFields
	var messages, system, tools, toolChoice, thinking, outputConfig, kwargs chatField
	messagesSeen := false
	err = readObject(dec, lim, func(key string) error {
		if read, err := fields.read(dec, key); read {
			return err
		}
		var err error
		switch key {
		case "messages":
			messages, err = readChatField(dec)
			messagesSeen = true
		case "system":
			system, err = readChatField(dec)
		case "tools":
			tools, err = readChatField(dec)
		case "tool_choice":
			toolChoice, err = readChatField(dec)
		case "thinking":
			thinking, err = readChatField(dec)
		case "output_config":
			outputConfig, err = readChatField(dec)
		case "chat_template_kwargs":
			kwargs, err = readChatField(dec)
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// ParseMessages' checks, so that a body gets the same *FieldError.
	if _, err := fields.judge(); err != nil {
		return nil, err
	}
	for _, f := range []chatField{messages, system, tools, toolChoice, thinking, outputConfig, kwargs} {
		if f.unread {
			return nil, messagesNotRendered("the request's values would take more than %d bytes per byte of the request body", valueBytesPerBodyByte)
		}
	}
	if !messagesSeen {
		return nil, messagesNotRendered("'messages' is missing")
	}

	// vLLM validates the whole request before converting it.
	if err := checkAnthropicMessages(messages.v); err != nil {
		return nil, err
	}
	if err := checkToolChoice(toolChoice.v); err != nil {
		return nil, err
	}
	typ, _ := toolChoice.v.Get("type")
	toolChoiceNone := typ.Str() == "none"
	if err := checkThinking(thinking.v); err != nil {
		return nil, err
	}
	effort, err := outputEffort(outputConfig.v)
	if err != nil {
		return nil, err
	}
	switch kwargs.v.Kind() {
	case jsonv.Null, jsonv.Object:
	default:
		return nil, messagesNotRendered("'chat_template_kwargs' must be an object")
	}

	// The chat built from the values read takes at most as much again as they may.
	conv := messagesConversion{left: budget}
	prompt, err := conv.systemPrompt(system.v)
	if err != nil {
		return nil, err
	}
	items := messages.v.Items()
	n, leadingTexts, inline := inlineSystem(items)
	if err := conv.chargeLeading(leadingTexts); err != nil {
		return nil, err
	}
	leading := joinNonEmpty(leadingTexts...)
	if !inline {
		// Every system message leads messages or has no text: both modes give this chat.
		if err := conv.addSystem(prompt, leading); err != nil {
			return nil, err
		}
		for i, m := range items {
			if err := conv.message(m); err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
		}
		chatTools, err := conv.toolsOf(tools.v)
		if err != nil {
			return nil, err
		}
		chat, err := conv.finish(chatTools, kwargs.v, effort, nil)
		if err != nil {
			return nil, err
		}
		chat.ToolChoiceNone = toolChoiceNone
		return chat, nil
	}
	// vLLM's fold mode, and its preserve mode unless it folds too (no system text).
	hasSystem := prompt != "" || leading != ""
	var chatTools jsonv.Value
	folded, err := conv.inlineChat(items, n, InlineSystemFold, hasSystem, prompt, leading, &chatTools, tools.v, kwargs.v, effort, nil)
	if err != nil {
		return nil, err
	}
	// Either form may be the one rendered, and both are the same request's.
	folded.ToolChoiceNone = toolChoiceNone
	if !hasSystem {
		return folded, nil
	}
	// The second chat's values count against what is left of the same budget.
	kept := messagesConversion{left: conv.left}
	chat, err := kept.inlineChat(items, n, InlineSystemPreserve, hasSystem, prompt, leading, &chatTools, tools.v, kwargs.v, effort, folded)
	if err != nil {
		return nil, err
	}
	chat.ToolChoiceNone = toolChoiceNone
	return chat, nil
}

// inlineChat builds the chat of a request with inline system messages, placed in mode
// (normalizeInlineSystem), Folded set to folded. chatTools are the request's tools
// converted, converted and set when they are still null (both chats share them).
func (c *messagesConversion) inlineChat(items []jsonv.Value, n int, mode InlineSystemMode, hasSystem bool,
	prompt, leading string, chatTools *jsonv.Value, tools, kwargs, effort jsonv.Value, folded *tokenize.Chat) (*tokenize.Chat, error) {
	placed, err := c.normalizeInlineSystem(items, n, mode, hasSystem)
	if err != nil {
		return nil, err
	}
	if err := c.addSystem(prompt, leading); err != nil {
		return nil, err
	}
	for _, p := range placed {
		if messageRole(p.m) == "system" {
			// A system message preserve keeps in place (_convert_messages).
			if text := systemText(p.m); text != "" {
				if err := c.charge(len(text)); err != nil {
					return nil, err
				}
				if err := c.add(object2("role", systemRole, "content", jsonv.StringValue(text))); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := c.message(p.m); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", p.i, err)
		}
	}
	if chatTools.IsNull() {
		if *chatTools, err = c.toolsOf(tools); err != nil {
			return nil, err
		}
	}
	return c.finish(*chatTools, kwargs, effort, folded)
}

// toolsOf converts the request's tools, once its messages are: a request with no
// message is not rendered, whatever its tools.
func (c *messagesConversion) toolsOf(tools jsonv.Value) (jsonv.Value, error) {
	if len(c.messages) == 0 {
		return jsonv.Value{}, messagesNotRendered("the request has no message")
	}
	return c.tools(tools)
}

// finish builds the chat of the messages and tools converted.
func (c *messagesConversion) finish(chatTools, kwargs, effort jsonv.Value, folded *tokenize.Chat) (*tokenize.Chat, error) {
	// readChat's merged kwargs: the request's and two more.
	if err := c.charge(2 * valueBytes * (kwargs.Len() + 2)); err != nil {
		return nil, err
	}
	// The chat completion's own rules (message checks, the kwargs and the effort), in
	// the one place kvroute has them.
	chat, err := readChat(chatField{v: jsonv.ArrayValue(c.messages...)}, chatField{v: chatTools}, chatField{},
		chatField{v: kwargs}, jsonv.Value{}, jsonv.Value{}, effort)
	if err != nil {
		// Not the client's error as a Messages request: the engine judges it.
		return nil, messagesNotRendered("the chat completion built is refused: %v", err)
	}
	chat.Folded = folded
	return chat, nil
}

// checkAnthropicMessages checks messages as vLLM's AnthropicMessage validates them: a list of
// objects of role user, assistant or system whose content is a string or a list of
// valid content blocks.
func checkAnthropicMessages(messages jsonv.Value) error {
	if messages.Kind() != jsonv.Array {
		return messagesNotRendered("'messages' must be a list")
	}
	for i, m := range messages.Items() {
		if m.Kind() != jsonv.Object {
			return messagesNotRendered("messages[%d] must be an object", i)
		}
		switch role, _ := m.Get("role"); role.Str() {
		case "user", "assistant", "system":
			if role.Kind() != jsonv.String {
				return messagesNotRendered("messages[%d].role must be a string", i)
			}
		default:
			return messagesNotRendered("messages[%d]: a role other than user, assistant and system", i)
		}
		if err := checkContent(m); err != nil {
			return fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	return nil
}

// checkContent checks a message's content: a string, or a list of content blocks.
func checkContent(m jsonv.Value) error {
	content, _ := m.Get("content")
	switch content.Kind() {
	case jsonv.String:
		return nil
	case jsonv.Array:
		return checkBlocks(content)
	}
	return messagesNotRendered("content must be a string or a list of blocks")
}

// checkBlocks checks a list of content blocks as vLLM's AnthropicContentBlock validates
// each: an object of a known type whose fields have their types (other keys ignored).
func checkBlocks(blocks jsonv.Value) error {
	for j, b := range blocks.Items() {
		if err := checkBlock(b); err != nil {
			return fmt.Errorf("content[%d]: %w", j, err)
		}
	}
	return nil
}

// blockStrings are AnthropicContentBlock's fields of type str | None.
var blockStrings = []string{"text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"}

func checkBlock(b jsonv.Value) error {
	if b.Kind() != jsonv.Object {
		return messagesNotRendered("a content block must be an object")
	}
	typ, _ := b.Get("type")
	switch typ.Str() {
	case "text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking":
	default:
		// document, server_tool_use, search_result…: vLLM refuses them.
		return messagesNotRendered("content blocks of type %.64q are not rendered (vLLM refuses them)", typ.Str())
	}
	if typ.Kind() != jsonv.String {
		return messagesNotRendered("a content block's type must be a string")
	}
	for _, k := range blockStrings {
		if v, _ := b.Get(k); v.Kind() != jsonv.Null && v.Kind() != jsonv.String {
			return messagesNotRendered("a content block's %s must be a string", k)
		}
	}
	for _, k := range []string{"source", "input"} {
		if v, _ := b.Get(k); v.Kind() != jsonv.Null && v.Kind() != jsonv.Object {
			return messagesNotRendered("a content block's %s must be an object", k)
		}
	}
	switch content, _ := b.Get("content"); content.Kind() {
	case jsonv.Null, jsonv.String:
	case jsonv.Array:
		for _, it := range content.Items() {
			if it.Kind() != jsonv.Object {
				return messagesNotRendered("a content block's content must be a string or a list of objects")
			}
		}
	default:
		return messagesNotRendered("a content block's content must be a string or a list of objects")
	}
	if v, _ := b.Get("is_error"); !v.IsNull() {
		if _, ok := laxBool(v); !ok {
			return messagesNotRendered("a content block's is_error must be a boolean")
		}
	}
	return nil
}

// checkToolChoice checks tool_choice as AnthropicToolChoice validates it. It reaches
// the prompt only through ToolChoiceNone.
func checkToolChoice(tc jsonv.Value) error {
	switch tc.Kind() {
	case jsonv.Null:
		return nil
	case jsonv.Object:
	default:
		return messagesNotRendered("'tool_choice' must be an object")
	}
	typ, _ := tc.Get("type")
	name, _ := tc.Get("name")
	if name.Kind() != jsonv.Null && name.Kind() != jsonv.String {
		return messagesNotRendered("'tool_choice.name' must be a string")
	}
	if v, _ := tc.Get("disable_parallel_tool_use"); !v.IsNull() {
		if _, ok := laxBool(v); !ok {
			return messagesNotRendered("'tool_choice.disable_parallel_tool_use' must be a boolean")
		}
	}
	switch typ.Str() {
	case "auto", "any", "none":
	case "tool":
		if name.Str() == "" {
			return messagesNotRendered("'tool_choice.name' is required when its type is tool")
		}
	default:
		return messagesNotRendered("'tool_choice.type' must be auto, any, tool or none")
	}
	if typ.Kind() != jsonv.String {
		return messagesNotRendered("'tool_choice.type' must be a string")
	}
	return nil
}

// checkThinking checks the thinking config's type. enabled (a sampling budget) and
// adaptive leave the prompt alone; disabled sets the chat's reasoning_effort to "none",
// or "low" when vLLM's probe of the chat template finds "none" refused or ignored (or
// as the server's --anthropic-disabled-thinking-effort says), which kvroute cannot
// tell.
func checkThinking(thinking jsonv.Value) error {
	switch thinking.Kind() {
	case jsonv.Null:
		return nil
	case jsonv.Object:
	default:
		return messagesNotRendered("'thinking' must be an object")
	}
	switch typ, _ := thinking.Get("type"); {
	case typ.Kind() == jsonv.String && (typ.Str() == "enabled" || typ.Str() == "adaptive"):
		return nil
	case typ.Kind() == jsonv.String && typ.Str() == "disabled":
		return messagesNotRendered("thinking disabled: vLLM picks its reasoning_effort by probing the chat template")
	}
	return messagesNotRendered("'thinking.type' must be enabled, disabled or adaptive")
}

// outputEffort is output_config.effort (null when unset), which vLLM passes on as the
// chat's reasoning_effort.
func outputEffort(config jsonv.Value) (jsonv.Value, error) {
	switch config.Kind() {
	case jsonv.Null:
		return jsonv.Value{}, nil
	case jsonv.Object:
	default:
		return jsonv.Value{}, messagesNotRendered("'output_config' must be an object")
	}
	effort, _ := config.Get("effort")
	switch {
	case effort.IsNull():
		return jsonv.Value{}, nil
	case effort.Kind() == jsonv.String:
		switch effort.Str() {
		case "low", "medium", "high", "xhigh", "max":
			return effort, nil
		}
	}
	return jsonv.Value{}, messagesNotRendered("'output_config.effort' must be low, medium, high, xhigh or max")
}

// messagesConversion is the chat built so far.
type messagesConversion struct {
	messages []jsonv.Value
	left     int // the bytes the chat's values may still take
	parts    []jsonv.Value
	calls    []jsonv.Value
	texts    []string // a message's reasoning texts
	results  []string // a tool result's texts
}

// charge takes what the chat's next values take from what is left to it.
func (c *messagesConversion) charge(bytes int) error {
	if bytes > c.left {
		return messagesNotRendered("the chat would take more than %d bytes per byte of the request body", valueBytesPerBodyByte)
	}
	c.left -= bytes
	return nil
}

// add appends a message of n members (charged with its slot in the list, twice for
// the list's growth).
func (c *messagesConversion) add(m jsonv.Value) error {
	if err := c.charge(2*valueBytes*m.Len() + 2*valueBytes); err != nil {
		return err
	}
	c.messages = append(c.messages, m)
	return nil
}

// Values the conversion builds with.
var (
	toolCallKeys   = []string{"id", "type", "function"}
	toolResultKeys = []string{"role", "tool_call_id", "content"}
	emptyArguments = jsonv.StringValue("{}")
	typeObject     = jsonv.StringValue("object")
)

// blocksText is the text of a list of system blocks: its non-empty text blocks'
// that do not start with the billing header, joined with no separator.
func blocksText(blocks jsonv.Value) string {
	var b strings.Builder
	for _, bl := range blocks.Items() {
		typ, _ := bl.Get("type")
		text, _ := bl.Get("text")
		if typ.Str() == "text" && text.Str() != "" && !strings.HasPrefix(text.Str(), billingHeader) {
			b.WriteString(text.Str())
		}
	}
	return b.String()
}

// systemText is a system message's text (inline_system.py system_text): its string
// unless that starts with the billing header, or its blocks' text.
func systemText(m jsonv.Value) string {
	content, _ := m.Get("content")
	if content.Kind() == jsonv.String {
		if strings.HasPrefix(content.Str(), billingHeader) {
			return ""
		}
		return content.Str()
	}
	return blocksText(content)
}

// joinNonEmpty is inline_system.py's _join: the non-empty texts joined with "\n\n".
func joinNonEmpty(texts ...string) string {
	size := 0
	for _, t := range texts {
		size += len(t) + 2
	}
	var b strings.Builder
	b.Grow(size)
	for _, t := range texts {
		if t == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(t)
	}
	return b.String()
}

// systemPrompt is the text of the request's system field (system_prompt_text): a
// string as is (the top-level string keeps a billing header), or its blocks' text.
func (c *messagesConversion) systemPrompt(system jsonv.Value) (string, error) {
	var prompt string
	switch system.Kind() {
	case jsonv.Null:
	case jsonv.String:
		prompt = system.Str()
	case jsonv.Array:
		if err := checkBlocks(system); err != nil {
			return "", fmt.Errorf("system: %w", err)
		}
		prompt = blocksText(system)
	default:
		return "", messagesNotRendered("'system' must be a string or a list of blocks")
	}
	return prompt, c.charge(2 * len(prompt))
}

// chargeLeading charges the texts of the system messages that lead messages.
func (c *messagesConversion) chargeLeading(texts []string) error {
	for _, text := range texts {
		// The text, its list slot (twice, for the list's growth) and its join.
		if err := c.charge(2*len(text) + 2*valueBytes + 2); err != nil {
			return err
		}
	}
	return nil
}

// addSystem adds the leading system message: the request's system prompt, then the
// texts of the system messages that lead messages (normalize_inline_system's leading
// text), joined with "\n\n"; none when that is empty.
func (c *messagesConversion) addSystem(prompt, leading string) error {
	text := joinNonEmpty(prompt, leading)
	if text == "" {
		return nil
	}
	return c.add(object2("role", systemRole, "content", jsonv.StringValue(text)))
}

// message converts a user or assistant message, appending the messages it gives; a
// system message gives none (they were placed before).
func (c *messagesConversion) message(m jsonv.Value) error {
	role, _ := m.Get("role")
	if role.Str() == "system" {
		return nil
	}
	content, _ := m.Get("content")
	if content.Kind() == jsonv.String {
		return c.add(object2("role", role, "content", content))
	}
	// The scratch lists, grown to the blocks' count.
	n := content.Len()
	if err := c.charge(valueBytes * n); err != nil {
		return err
	}
	parts, calls, texts := slices.Grow(c.parts[:0], n), c.calls[:0], c.texts[:0]
	hasReasoning := false
	for j, b := range content.Items() {
		typ, _ := b.Get("type")
		switch typ.Str() {
		case "text":
			if text, _ := b.Get("text"); text.Str() != "" {
				if err := c.charge(8 * valueBytes); err != nil {
					return err
				}
				parts = append(parts, object2("type", textType, "text", text))
			}
		case "image":
			if source, _ := b.Get("source"); source.Len() > 0 {
				return messagesNotRendered("content[%d]: image blocks are not rendered", j)
			}
		case "thinking":
			if thinking, _ := b.Get("thinking"); thinking.Kind() == jsonv.String {
				hasReasoning = true
				texts = append(texts, thinking.Str())
			}
		case "tool_use":
			call, err := c.toolCall(b)
			if err != nil {
				return fmt.Errorf("content[%d]: %w", j, err)
			}
			calls = append(calls, call)
		case "tool_result":
			var err error
			if role.Str() == "user" {
				err = c.userToolResult(b)
			} else {
				var part jsonv.Value
				if part, err = c.assistantToolResult(b); err == nil {
					parts = append(parts, part)
				}
			}
			if err != nil {
				return fmt.Errorf("content[%d]: %w", j, err)
			}
		}
	}
	c.parts, c.calls, c.texts = parts, calls, texts
	var keys [4]string
	var vals [4]jsonv.Value
	keys[0], vals[0] = "role", role
	n = 1
	if hasReasoning {
		size := 0
		for _, t := range texts {
			size += len(t)
		}
		if err := c.charge(size); err != nil {
			return err
		}
		keys[n], vals[n] = "reasoning", jsonv.StringValue(strings.Join(texts, ""))
		n++
	}
	if len(calls) > 0 {
		if err := c.charge(2 * valueBytes * len(calls)); err != nil {
			return err
		}
		keys[n], vals[n] = "tool_calls", jsonv.ArrayValue(append([]jsonv.Value(nil), calls...)...)
		n++
	}
	switch len(parts) {
	case 0:
		if role.Str() == "user" {
			return nil // a user message of tool results alone
		}
	case 1:
		text, _ := parts[0].Get("text")
		keys[n], vals[n] = "content", text
		n++
	default:
		if err := c.charge(2 * valueBytes * len(parts)); err != nil {
			return err
		}
		keys[n], vals[n] = "content", jsonv.ArrayValue(append([]jsonv.Value(nil), parts...)...)
		n++
	}
	return c.add(jsonv.ObjectValue(keys[:n], vals[:n]))
}

// toolCall converts a tool_use block into a chat tool call.
func (c *messagesConversion) toolCall(b jsonv.Value) (jsonv.Value, error) {
	id, _ := b.Get("id")
	if id.Str() == "" {
		return jsonv.Value{}, messagesNotRendered("a tool_use block without an id: vLLM makes one up from the clock")
	}
	name, _ := b.Get("name")
	if name.IsNull() {
		name = jsonv.StringValue("")
	}
	args := emptyArguments
	if input, _ := b.Get("input"); input.Len() > 0 {
		size, err := pyDumpsSize(input)
		if err != nil {
			return jsonv.Value{}, err
		}
		if err := c.charge(size); err != nil {
			return jsonv.Value{}, err
		}
		// The bytes are the string's: never written again, so not copied.
		buf := appendPyDumps(make([]byte, 0, size), input)
		args = jsonv.StringValue(unsafe.String(unsafe.SliceData(buf), len(buf)))
	}
	// The call's two objects, and its slots in the scratch list and the message's.
	if err := c.charge(16 * valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	fn := object2("name", name, "arguments", args)
	return jsonv.ObjectValue(toolCallKeys, []jsonv.Value{id, functionType, fn}), nil
}

// userToolResult appends the tool message of a user message's tool_result block.
func (c *messagesConversion) userToolResult(b jsonv.Value) error {
	id, _ := b.Get("tool_use_id")
	if id.IsNull() {
		id = jsonv.StringValue("")
	}
	content, _ := b.Get("content")
	var text jsonv.Value
	switch content.Kind() {
	case jsonv.String:
		text = content
	case jsonv.Array:
		texts := c.results[:0]
		size := 0
		for k, it := range content.Items() {
			typ, _ := it.Get("type")
			if typ.Kind() != jsonv.String {
				continue
			}
			switch typ.Str() {
			case "text":
				// item.get("text", ""): absent is "", another type fails vLLM's join.
				if t, ok := it.Get("text"); ok && t.Kind() != jsonv.String {
					return messagesNotRendered("content[%d]: a tool result's text must be a string (vLLM fails on it)", k)
				} else {
					texts = append(texts, t.Str())
					size += len(t.Str()) + 1
				}
			case "image":
				if imageDropped(it) {
					continue
				}
				return messagesNotRendered("content[%d]: images in tool results are not rendered", k)
			case "tool_reference":
				ref, _ := it.Get("tool_name")
				if !ref.Truthy() {
					ref, _ = it.Get("name")
				}
				if ref.Truthy() {
					return messagesNotRendered("content[%d]: tool references in tool results are not rendered", k)
				}
			}
		}
		c.results = texts
		if err := c.charge(size); err != nil {
			return err
		}
		text = jsonv.StringValue(strings.Join(texts, "\n"))
	default:
		text = jsonv.StringValue("")
	}
	if err := c.charge(4 * valueBytes); err != nil {
		return err
	}
	return c.add(jsonv.ObjectValue(toolResultKeys, []jsonv.Value{toolRole, id, text}))
}

// imageDropped reports whether vLLM drops an image item of a tool result rather than
// showing it in a user message: a url source whose url is falsy. An item whose source
// is not an object fails vLLM (its error is a 500), and is not dropped.
func imageDropped(item jsonv.Value) bool {
	source, ok := item.Get("source")
	if !ok || source.Kind() != jsonv.Object {
		return false
	}
	typ, _ := source.Get("type")
	url, _ := source.Get("url")
	return typ.Kind() == jsonv.String && typ.Str() == "url" && !url.Truthy()
}

// assistantToolResult is the text part of an assistant message's tool_result block:
// "Tool result: " and its content, Python's str() of it, which kvroute rebuilds for a
// string alone.
func (c *messagesConversion) assistantToolResult(b jsonv.Value) (jsonv.Value, error) {
	const prefix = "Tool result: "
	content, _ := b.Get("content")
	text := ""
	switch content.Kind() {
	case jsonv.String:
		text = content.Str()
	case jsonv.Array:
		if content.Len() > 0 {
			return jsonv.Value{}, messagesNotRendered("a tool_result of blocks in an assistant message: vLLM renders Python's repr of them")
		}
	}
	if err := c.charge(len(prefix) + len(text) + 6*valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	return object2("type", textType, "text", jsonv.StringValue(prefix+text)), nil
}

// tools converts the request's tools into chat tools (_convert_tools): nil when there
// are none, an empty list for an empty list.
func (c *messagesConversion) tools(tools jsonv.Value) (jsonv.Value, error) {
	switch tools.Kind() {
	case jsonv.Null:
		return jsonv.Value{}, nil
	case jsonv.Array:
	default:
		return jsonv.Value{}, messagesNotRendered("'tools' must be a list")
	}
	if err := c.charge(2 * valueBytes * tools.Len()); err != nil {
		return jsonv.Value{}, err
	}
	out := make([]jsonv.Value, 0, tools.Len())
	for i, t := range tools.Items() {
		tool, err := c.tool(t)
		if err != nil {
			return jsonv.Value{}, fmt.Errorf("tools[%d]: %w", i, err)
		}
		out = append(out, tool)
	}
	return jsonv.ArrayValue(out...), nil
}

// tool converts one tool as AnthropicTool validates it and vLLM's FunctionDefinition
// dumps it.
func (c *messagesConversion) tool(t jsonv.Value) (jsonv.Value, error) {
	if t.Kind() != jsonv.Object {
		return jsonv.Value{}, messagesNotRendered("a tool must be an object")
	}
	name, _ := t.Get("name")
	description, _ := t.Get("description")
	schema, _ := t.Get("input_schema")
	if name.Kind() != jsonv.String || description.Kind() != jsonv.Null && description.Kind() != jsonv.String {
		return jsonv.Value{}, messagesNotRendered("a tool must have a string name, and description a string or null")
	}
	if schema.Kind() != jsonv.Object {
		// Anthropic's server tools (web_search…) have none: vLLM refuses them.
		return jsonv.Value{}, messagesNotRendered("a tool must have an object input_schema")
	}
	var flags [2]jsonv.Value // strict, defer_loading
	for i, k := range []string{"strict", "defer_loading"} {
		if v, _ := t.Get(k); !v.IsNull() {
			b, ok := laxBool(v)
			if !ok {
				return jsonv.Value{}, messagesNotRendered("a tool's %s must be a boolean", k)
			}
			flags[i] = jsonv.BoolValue(b)
		}
	}
	if _, typed := schema.Get("type"); !typed {
		n := schema.Len()
		// The members' lists and the object's.
		if err := c.charge(4 * valueBytes * (n + 1)); err != nil {
			return jsonv.Value{}, err
		}
		keys, vals := make([]string, 0, n+1), make([]jsonv.Value, 0, n+1)
		for i := range n {
			k, v := schema.Member(i)
			keys, vals = append(keys, k), append(vals, v)
		}
		schema = jsonv.ObjectValue(append(keys, "type"), append(vals, typeObject))
	}
	// The function object of up to 5 members, its lists, and the tool's object.
	if err := c.charge(20*valueBytes + 8*valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	keys, vals := make([]string, 0, 5), make([]jsonv.Value, 0, 5)
	keys, vals = append(keys, "name", "description", "parameters"), append(vals, name, description, schema)
	if !flags[1].IsNull() {
		keys, vals = append(keys, "defer_loading"), append(vals, flags[1])
	}
	keys, vals = append(keys, "strict"), append(vals, flags[0])
	return object2("type", functionType, "function", jsonv.ObjectValue(keys, vals)), nil
}

// pythonIntMaxDigits is CPython's default sys.get_int_max_str_digits: json.loads
// refuses a longer integer.
const pythonIntMaxDigits = 4300

// pyDumpsSize is the length of CPython's json.dumps of v (appendPyDumps), or an error
// for a number Python would not print back as kvroute reads it.
func pyDumpsSize(v jsonv.Value) (int, error) {
	switch v.Kind() {
	case jsonv.Null:
		return 4, nil
	case jsonv.True:
		return 4, nil
	case jsonv.False:
		return 5, nil
	case jsonv.Number:
		if v.IsInteger() {
			// Measured without copying a long literal.
			digits, err := pyIntDigits(v.Str())
			return len(digits), err
		}
		var buf [32]byte
		out, err := appendPyNumber(buf[:0], v)
		return len(out), err
	case jsonv.String:
		return quotedASCIISize(v.Str()), nil
	case jsonv.Array:
		n := 2 + 2*max(0, v.Len()-1)
		for _, it := range v.Items() {
			m, err := pyDumpsSize(it)
			if err != nil {
				return 0, err
			}
			n += m
		}
		return n, nil
	}
	n := 2 + 2*max(0, v.Len()-1)
	for i := range v.Len() {
		k, val := v.Member(i)
		m, err := pyDumpsSize(val)
		if err != nil {
			return 0, err
		}
		n += quotedASCIISize(k) + 2 + m
	}
	return n, nil
}

// quotedASCIISize is the length of jsonv.AppendQuoted(s, true).
func quotedASCIISize(s string) int {
	n := 2
	for _, r := range s {
		switch {
		case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t' || r == '\b' || r == '\f':
			n += 2
		case r < 0x20 || r == 0x7f:
			n += 6
		case r < 0x80:
			n++
		case r >= 0x10000:
			n += 12
		default:
			n += 6
		}
	}
	return n
}

// appendPyDumps appends CPython's json.dumps of v with its defaults: ", " and ": "
// separators, every non-ASCII character escaped, keys in order. v's numbers must have
// passed pyDumpsSize.
func appendPyDumps(dst []byte, v jsonv.Value) []byte {
	switch v.Kind() {
	case jsonv.Null:
		return append(dst, "null"...)
	case jsonv.True:
		return append(dst, "true"...)
	case jsonv.False:
		return append(dst, "false"...)
	case jsonv.Number:
		dst, _ = appendPyNumber(dst, v)
		return dst
	case jsonv.String:
		return jsonv.AppendQuoted(dst, v.Str(), true)
	case jsonv.Array:
		dst = append(dst, '[')
		for i, it := range v.Items() {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendPyDumps(dst, it)
		}
		return append(dst, ']')
	}
	dst = append(dst, '{')
	for i := range v.Len() {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		k, val := v.Member(i)
		dst = jsonv.AppendQuoted(dst, k, true)
		dst = append(dst, ": "...)
		dst = appendPyDumps(dst, val)
	}
	return append(dst, '}')
}

// appendPyNumber appends a JSON number as Python's json reads and then prints it: an
// integer literal is an int (printed in decimal: "-0" is 0), any other a float,
// printed as repr does.
func appendPyNumber(dst []byte, v jsonv.Value) ([]byte, error) {
	if v.IsInteger() {
		digits, err := pyIntDigits(v.Str())
		return append(dst, digits...), err
	}
	f, ok := v.Float()
	if !ok || math.IsInf(f, 0) || math.IsNaN(f) {
		return dst, messagesNotRendered("a tool_use input number that is not finite (beyond float64, which Python reads as infinity, or NaN or Infinity)")
	}
	return appendPyFloat(dst, f), nil
}

// pyIntDigits is how Python prints the int of an integer literal: as written, but
// "-0" as 0; an error for one longer than Python reads.
func pyIntDigits(lit string) (string, error) {
	digits := strings.TrimPrefix(lit, "-")
	switch {
	case len(digits) > pythonIntMaxDigits:
		return "", messagesNotRendered("a tool_use input integer of more than %d digits (Python refuses it)", pythonIntMaxDigits)
	case strings.Trim(digits, "0") == "":
		return "0", nil
	}
	return lit, nil
}

// appendPyFloat appends Python's repr of a finite float: the shortest digits that read
// back as f, in positional notation (with at least one fractional digit) when the
// decimal exponent is in [-4, 16), else as d.ddde±XX.
func appendPyFloat(dst []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	var buf, digitsBuf [32]byte
	s := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // d[.ddd]e±XX
	e := bytes.IndexByte(s, 'e')
	mant, exp := s[:e], s[e+1:]
	x := 0
	for _, c := range exp[1:] {
		x = 10*x + int(c-'0')
	}
	if exp[0] == '-' {
		x = -x
	}
	digits := append(digitsBuf[:0], mant[0])
	if len(mant) > 2 {
		digits = append(digits, mant[2:]...)
	}
	if x < -4 || x >= 16 {
		dst = append(dst, digits[0])
		if len(digits) > 1 {
			dst = append(append(dst, '.'), digits[1:]...)
		}
		dst = append(dst, 'e')
		if x < 0 {
			dst, x = append(dst, '-'), -x
		} else {
			dst = append(dst, '+')
		}
		if x < 10 {
			dst = append(dst, '0')
		}
		return strconv.AppendInt(dst, int64(x), 10)
	}
	if x < 0 {
		dst = append(dst, "0."...)
		for range -x - 1 {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	}
	if len(digits) <= x+1 {
		dst = append(dst, digits...)
		for range x + 1 - len(digits) {
			dst = append(dst, '0')
		}
		return append(dst, ".0"...)
	}
	dst = append(dst, digits[:x+1]...)
	return append(append(dst, '.'), digits[x+1:]...)
}
