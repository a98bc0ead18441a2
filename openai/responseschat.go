package openai

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// ErrResponsesNotRendered is wrapped by [ResponsesChat]'s errors for bodies whose prompt
// kvroute does not rebuild: the request is then routed by load, not refused (the engine,
// which reads the body itself, judges it). It never wraps [ErrBadRequest].
var ErrResponsesNotRendered = errors.New("openai: the Responses request's prompt is not rebuilt")

func notRendered(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrResponsesNotRendered, fmt.Sprintf(format, args...))
}

// ResponsesChat builds the chat vLLM renders for a Responses API request body
// (POST /v1/responses) on a non-Harmony model (every model but gpt-oss) with no
// previous_response_id: vLLM converts the body into chat messages, tools and template
// kwargs, then renders them exactly as a chat completion, so kvroute's chat renderers
// and tokenizers route the request by its prompt's prefix. The conversion follows vLLM's
// (vllm/entrypoints/openai/responses/utils.py construct_input_messages and
// construct_tool_dicts, responses/protocol.py build_chat_params; docs/RESPONSES_API.md
// §1.2):
//
//   - instructions, a non-empty string, becomes a leading system message;
//   - input, a string, becomes one user message; a list is converted item by item:
//     a user, system or developer message (the short {"role","content"} form, or type
//     "message") becomes {"role","content"}, its input_text and output_text parts text
//     parts; an assistant message takes the text of its first content part ("" when
//     there is none) as content; a function_call becomes a tool call
//     {"id","function":{"name","arguments"},"type"} (the name "<namespace>__<name>" when
//     namespaced, the arguments the string as sent); a reasoning item takes the text of
//     its first content part, else of its first summary part, as reasoning; a
//     function_call_output becomes {"role":"tool","content","tool_call_id"}. A tool
//     call, reasoning or assistant content joins the previous message when that is an
//     assistant message that has none yet (tool calls are always appended), else starts
//     an assistant message;
//   - tools: each function tool, and each function tool of a namespace (renamed
//     "<namespace>__<name>"), becomes a chat tool as vLLM's pydantic models dump it,
//     null values kept; other tool types add nothing. No tools gives nil Tools, tools
//     none of which is a function an empty list;
//   - tool_choice "none" (the string; absent is "auto") sets ToolChoiceNone, for the
//     model whose server runs with --exclude-tools-when-tool-choice-none: the newest
//     vLLM's construct_tool_dicts drops the tools then (versions of it without the
//     flag, in the search index, drop them for "none" whatever the server's flags);
//   - the last input item continues (ContinueFinalMessage, no generation prompt) when
//     it is an output message (an assistant message of type "message" and a list of
//     parts), a message of another role given as a list of parts, or a reasoning item,
//     whose status is in_progress or incomplete;
//   - the template kwargs are the request's chat_template_kwargs under vLLM's own:
//     reasoning.effort as reasoning_effort, and enable_thinking (effort not "none")
//     unless the request's kwargs set it (the latest vLLM's build_chat_params).
//
// A body rejected as a whole, or for its model, previous_response_id, store, background,
// stream or cache_salt, gets the *FieldError [ParseResponses] gives it. A body whose prompt is the
// engine's stored conversation (previous_response_id or previous_response set), whose
// input or tools hold what vLLM refuses or kvroute does not render (item types other
// than the above, images and files, encrypted reasoning, values of the wrong type), that
// has no message, or whose values would take more than the memory Parse allows a chat
// (4 bytes per byte of body, and as much again for the chat built from them) gets an
// error wrapping [ErrResponsesNotRendered].
func ResponsesChat(body []byte, lim Limits) (*tokenize.Chat, error) {
	dec, err := objectDecoder(body, lim)
	if err != nil {
		return nil, err
	}
	dec.SetValueBudget(valueBytesPerBodyByte*len(body) + valueBytesFloor)
	// As in ParseResponses, values are kept and judged once the body is read, so that a
	// later duplicate overrides an earlier one.
	var fields responsesFields
	var instructions jsonv.Value
	var input, tools, reasoning, kwargs chatField
	var toolChoice toolChoiceField
	var inputSeen, history bool
	err = readObject(dec, lim, func(key string) error {
		if read, err := fields.read(dec, key); read {
			return err
		}
		var err error
		switch key {
		case "instructions":
			instructions, err = scalarField(dec)
		case "input":
			input, err = readChatField(dec)
			inputSeen = true
		case "tools":
			tools, err = readChatField(dec)
		case "tool_choice":
			toolChoice, err = readToolChoice(dec, body)
		case "reasoning":
			reasoning, err = readChatField(dec)
		case "chat_template_kwargs":
			kwargs, err = readChatField(dec)
		case "previous_response":
			// Newer vLLM's stateless continuation: the prompt starts with the history
			// its output carries, which is not rebuilt here.
			var k jsonv.Kind
			if k, err = dec.Peek(); err == nil {
				history = k != jsonv.Null
				err = dec.Skip()
			}
		default:
			err = dec.Skip()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// ParseResponses' checks, so that a body gets the same *FieldError.
	if _, err := fields.judge(); err != nil {
		return nil, err
	}

	switch {
	case !fields.previous.IsNull():
		return nil, notRendered("previous_response_id is set: the prompt starts with the engine's stored conversation")
	case history:
		return nil, notRendered("previous_response is set: the prompt starts with the history it carries")
	case input.unread || tools.unread || reasoning.unread || kwargs.unread:
		return nil, notRendered("the input's values would take more than %d bytes per byte of the request body", valueBytesPerBodyByte)
	case !inputSeen:
		return nil, notRendered("'input' is missing")
	}

	// The chat built from the values read takes at most as much again as they may.
	conv := responsesConversion{left: valueBytesPerBodyByte*len(body) + valueBytesFloor}
	switch instructions.Kind() {
	case jsonv.Null:
	case jsonv.String:
		if instructions.Str() != "" {
			_ = conv.add(object2("role", systemRole, "content", instructions)) // nothing is open to flush
		}
	default:
		return nil, notRendered("'instructions' must be a string")
	}
	continueFinal := false
	switch input.v.Kind() {
	case jsonv.String:
		_ = conv.add(object2("role", userRole, "content", input.v)) // nothing is open to flush
	case jsonv.Array:
		// An item gives at most one message.
		if err := conv.charge(valueBytes * input.v.Len()); err != nil {
			return nil, err
		}
		conv.messages = slices.Grow(conv.messages, input.v.Len())
		for i, item := range input.v.Items() {
			if err := conv.item(item); err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
		}
		if err := conv.flush(); err != nil {
			return nil, err
		}
		if n := input.v.Len(); n > 0 {
			continueFinal = continuesFinal(input.v.Items()[n-1])
		}
	default:
		return nil, notRendered("'input' must be a string or a list of items")
	}
	if len(conv.messages) == 0 {
		return nil, notRendered("the request has no message")
	}

	chat := &tokenize.Chat{
		Messages:             conv.messages,
		AddGenerationPrompt:  !continueFinal,
		ContinueFinalMessage: continueFinal,
		// ResponsesRequest's tool_choice defaults to "auto", whatever the tools.
		ToolChoiceNone: toolChoice.none,
	}
	if chat.Tools, err = conv.tools(tools.v); err != nil {
		return nil, err
	}
	if chat.TemplateKwargs, err = conv.templateKwargs(reasoning.v, kwargs.v, continueFinal); err != nil {
		return nil, err
	}
	return chat, nil
}

// object2 returns the object {k1: v1, k2: v2}.
func object2(k1 string, v1 jsonv.Value, k2 string, v2 jsonv.Value) jsonv.Value {
	return jsonv.ObjectValue([]string{k1, k2}, []jsonv.Value{v1, v2})
}

// assistantMessage is the assistant message later items may still join: its members
// in the order vLLM's dict gets them (role, then content, reasoning and tool_calls as
// items set them). The tool_calls member's value is calls, built when the message is
// done (vLLM appends to the list after the member is set).
type assistantMessage struct {
	keys  [4]string
	vals  [4]jsonv.Value
	n     int
	calls []jsonv.Value
}

func (m *assistantMessage) has(key string) bool { return slices.Contains(m.keys[:m.n], key) }

// set adds a member the message does not have.
func (m *assistantMessage) set(key string, v jsonv.Value) {
	m.keys[m.n], m.vals[m.n] = key, v
	m.n++
}

// addCall appends a tool call, adding the tool_calls member if the message has none.
func (m *assistantMessage) addCall(call jsonv.Value) {
	if !m.has("tool_calls") {
		m.set("tool_calls", jsonv.Value{})
	}
	m.calls = append(m.calls, call)
}

func (m *assistantMessage) value() jsonv.Value {
	for i, k := range m.keys[:m.n] {
		if k == "tool_calls" {
			m.vals[i] = jsonv.ArrayValue(m.calls...)
		}
	}
	return jsonv.ObjectValue(m.keys[:m.n], m.vals[:m.n])
}

// responsesConversion is the chat built so far: the messages done, then, while open,
// the assistant message the next item may join (vLLM joins an item only to the
// previous message).
type responsesConversion struct {
	messages []jsonv.Value
	last     assistantMessage
	open     bool
	left     int      // the bytes the chat's values may still take
	scratch  []string // a function tool's keys
	values   []jsonv.Value
}

// valueBytes is what a jsonv.Value takes in an array's or an object's items.
const valueBytes = 16

// charge takes what the chat's next values take from what is left to it.
func (c *responsesConversion) charge(bytes int) error {
	if bytes > c.left {
		return notRendered("the chat would take more than %d bytes per byte of the request body", valueBytesPerBodyByte)
	}
	c.left -= bytes
	return nil
}

// add appends a message no later item joins.
func (c *responsesConversion) add(m jsonv.Value) error {
	if err := c.flush(); err != nil {
		return err
	}
	c.messages = append(c.messages, m)
	return nil
}

// startAssistant opens a new assistant message {"role":"assistant"}, done with the
// open one.
func (c *responsesConversion) startAssistant() (*assistantMessage, error) {
	if err := c.flush(); err != nil {
		return nil, err
	}
	c.last, c.open = assistantMessage{}, true
	c.last.set("role", assistantRole)
	return &c.last, nil
}

// flush appends the open assistant message, if any, to the messages done.
func (c *responsesConversion) flush() error {
	if !c.open {
		return nil
	}
	c.open = false
	if err := c.charge(2 * valueBytes * c.last.n); err != nil {
		return err
	}
	c.messages = append(c.messages, c.last.value())
	return nil
}

// prevAssistant is the previous message when it is an assistant message, else nil.
func (c *responsesConversion) prevAssistant() *assistantMessage {
	if c.open {
		return &c.last
	}
	return nil
}

// Values the conversion builds with.
var (
	systemRole    = jsonv.StringValue("system")
	userRole      = jsonv.StringValue("user")
	assistantRole = jsonv.StringValue("assistant")
	toolRole      = jsonv.StringValue("tool")
	textType      = jsonv.StringValue("text")
	functionType  = jsonv.StringValue("function")
	callKeys      = []string{"id", "function", "type"}
	toolKeys      = []string{"role", "content", "tool_call_id"}
)

// item converts one input item (construct_chat_messages_with_tool_call).
func (c *responsesConversion) item(item jsonv.Value) error {
	if item.Kind() != jsonv.Object {
		return notRendered("an item must be an object")
	}
	typ, err := itemType(item)
	if err != nil {
		return err
	}
	switch typ {
	case "message":
		return c.message(item)
	case "function_call":
		return c.functionCall(item)
	case "reasoning":
		return c.reasoning(item)
	case "function_call_output":
		return c.functionCallOutput(item)
	}
	return notRendered("items of type %.64q are not rendered", typ)
}

// itemType is an item's type: "message" when absent (the short {"role","content"}
// form).
func itemType(item jsonv.Value) (string, error) {
	t, ok := item.Get("type")
	switch {
	case !ok:
		return "message", nil
	case t.Kind() != jsonv.String:
		return "", notRendered("an item's type must be a string")
	}
	return t.Str(), nil
}

// message converts a message item: an assistant message's first text joins the
// previous assistant message, others become {"role","content"}.
func (c *responsesConversion) message(item jsonv.Value) error {
	role, _ := item.Get("role")
	if role.Kind() != jsonv.String {
		return notRendered("a message item must have a string role")
	}
	content, _ := item.Get("content")
	switch role.Str() {
	case "user", "system", "developer":
		if item.Len() == 2 && content.Kind() == jsonv.String {
			if k0, _ := item.Member(0); k0 == "role" {
				if k1, _ := item.Member(1); k1 == "content" {
					return c.add(item) // already {"role","content"}: shared, not copied
				}
			}
		}
		parts, err := c.textContent(content)
		if err != nil {
			return err
		}
		if err := c.charge(4 * valueBytes); err != nil {
			return err
		}
		return c.add(object2("role", role, "content", parts))
	case "assistant":
	default:
		return notRendered("message items of role %.64q are not rendered", role.Str())
	}
	var text jsonv.Value
	var err error
	switch content.Kind() {
	case jsonv.String:
		text = content
	case jsonv.Array:
		text = jsonv.StringValue("")
		if content.Len() > 0 {
			// vLLM reads the first part's text alone.
			first := content.Items()[0]
			t, _ := first.Get("text")
			if t.Kind() != jsonv.String {
				return notRendered("an assistant message's first content part must have a string text")
			}
			text = t
		}
	default:
		return notRendered("an assistant message's content must be a string or a list of parts")
	}
	prev := c.prevAssistant()
	if prev == nil || prev.has("content") {
		if prev, err = c.startAssistant(); err != nil {
			return err
		}
	}
	prev.set("content", text)
	return nil
}

// textContent is a user, system or developer message's content, or a tool's output, as
// vLLM's chat parser reads it: a string, or a list of text parts (input_text and
// output_text parts are text).
func (c *responsesConversion) textContent(content jsonv.Value) (jsonv.Value, error) {
	switch content.Kind() {
	case jsonv.String:
		return content, nil
	case jsonv.Array:
	default:
		return jsonv.Value{}, notRendered("content must be a string or a list of parts")
	}
	if err := c.charge(5 * valueBytes * content.Len()); err != nil {
		return jsonv.Value{}, err
	}
	parts := make([]jsonv.Value, content.Len())
	for i, p := range content.Items() {
		t, _ := p.Get("type")
		switch t.Str() {
		case "input_text", "output_text", "text":
		case "input_image", "input_file", "input_audio", "image_url", "file":
			return jsonv.Value{}, notRendered("%.64q content parts are not rendered", t.Str())
		default:
			return jsonv.Value{}, notRendered("content parts must be text parts with a string type")
		}
		text, _ := p.Get("text")
		if t.Kind() != jsonv.String || text.Kind() != jsonv.String {
			return jsonv.Value{}, notRendered("a text part's text must be a string")
		}
		parts[i] = object2("type", textType, "text", text)
	}
	return jsonv.ArrayValue(parts...), nil
}

// optionalString reports whether an item's key is absent, null or a string, as a
// pydantic Optional[str] field requires.
func optionalString(item jsonv.Value, key string) bool {
	v, _ := item.Get(key)
	return v.Kind() == jsonv.Null || v.Kind() == jsonv.String
}

// validStatus reports whether an item's status is absent, null or one of the statuses
// an item may have.
func validStatus(item jsonv.Value) bool {
	v, _ := item.Get("status")
	switch {
	case v.Kind() == jsonv.Null:
		return true
	case v.Kind() != jsonv.String:
		return false
	}
	switch v.Str() {
	case "in_progress", "completed", "incomplete":
		return true
	}
	return false
}

// functionCall converts a function_call item into a tool call, appended to the previous
// assistant message's or starting an assistant message of tool calls alone.
func (c *responsesConversion) functionCall(item jsonv.Value) error {
	callID, _ := item.Get("call_id")
	name, _ := item.Get("name")
	args, _ := item.Get("arguments")
	if callID.Kind() != jsonv.String || name.Kind() != jsonv.String || args.Kind() != jsonv.String ||
		!optionalString(item, "id") || !optionalString(item, "namespace") || !validStatus(item) {
		// vLLM's ResponseFunctionToolCall refuses it, and the item reaches its chat
		// parser as a message without a role.
		return notRendered("a function_call must have string call_id, name and arguments")
	}
	ns, _ := item.Get("namespace")
	// The call's two objects, and its element of tool_calls (twice, for the list's
	// growth).
	if err := c.charge(12*valueBytes + len(ns.Str()) + 2 + len(name.Str())); err != nil {
		return err
	}
	if ns.Str() != "" {
		name = jsonv.StringValue(ns.Str() + "__" + name.Str())
	}
	call := jsonv.ObjectValue(callKeys, []jsonv.Value{callID, object2("name", name, "arguments", args), functionType})
	prev := c.prevAssistant()
	if prev == nil {
		var err error
		if prev, err = c.startAssistant(); err != nil {
			return err
		}
	}
	prev.addCall(call)
	return nil
}

// reasoning converts a reasoning item: its first content part's text, else its first
// summary part's, else "", as the previous assistant message's reasoning or a new
// assistant message's.
func (c *responsesConversion) reasoning(item jsonv.Value) error {
	if enc, _ := item.Get("encrypted_content"); enc.Kind() != jsonv.Null && (enc.Kind() != jsonv.String || enc.Str() != "") {
		return notRendered("encrypted reasoning is not rendered (vLLM refuses it)")
	}
	content, _ := item.Get("content")
	summary, ok := item.Get("summary")
	if !ok || summary.Kind() != jsonv.Array || content.Kind() != jsonv.Null && content.Kind() != jsonv.Array || !validStatus(item) {
		return notRendered("a reasoning item must have a summary list, and content a list or null")
	}
	var text jsonv.Value
	switch {
	case content.Len() > 0:
		text, _ = content.Items()[0].Get("text")
	case summary.Len() > 0:
		text, _ = summary.Items()[0].Get("text")
	default:
		text = jsonv.StringValue("")
	}
	if text.Kind() != jsonv.String {
		return notRendered("a reasoning item's text parts must have a string text")
	}
	prev := c.prevAssistant()
	if prev == nil || prev.has("reasoning") {
		var err error
		if prev, err = c.startAssistant(); err != nil {
			return err
		}
	}
	prev.set("reasoning", text)
	return nil
}

// functionCallOutput converts a function_call_output item into a tool message.
func (c *responsesConversion) functionCallOutput(item jsonv.Value) error {
	callID, _ := item.Get("call_id")
	output, ok := item.Get("output")
	if callID.Kind() != jsonv.String || !ok || !validStatus(item) {
		return notRendered("a function_call_output must have a string call_id and an output")
	}
	content, err := c.textContent(output)
	if err != nil {
		return err
	}
	if err := c.charge(6 * valueBytes); err != nil {
		return err
	}
	return c.add(jsonv.ObjectValue(toolKeys, []jsonv.Value{toolRole, content, callID}))
}

// continuesFinal reports whether vLLM continues the last input item instead of opening
// a new assistant turn (should_continue_final_message): a message or reasoning item
// whose status is in_progress or incomplete, as vLLM validates it. A message keeps its
// status only as an item model that declares one, not as the short-form
// EasyInputMessageParam, which drops it: an assistant message as an output message
// (type "message" and a list of parts), another as a Message (a list of parts).
func continuesFinal(last jsonv.Value) bool {
	typ, err := itemType(last)
	status, _ := last.Get("status")
	if err != nil || status.Kind() != jsonv.String || status.Str() != "in_progress" && status.Str() != "incomplete" {
		return false
	}
	switch typ {
	case "reasoning":
		return true
	case "message":
		role, _ := last.Get("role")
		content, _ := last.Get("content")
		if content.Kind() != jsonv.Array {
			return false
		}
		if role.Str() != "assistant" {
			return true
		}
		// The latest vLLM validates a typed assistant message of parts as a
		// ResponseOutputMessage (input_item_parsing), making up the id it lacks.
		_, typed := last.Get("type")
		return typed && optionalString(last, "id")
	}
	return false
}

// The declared fields of the openai SDK's tool models that vLLM dumps after name,
// description and parameters as extras, in the order of the SDK model's dump: every
// vLLM that takes namespace tools (PR #47024) imports the SDK's NamespaceTool (≥ 2.25),
// whose FunctionTool and namespace ToolFunction declare strict (2.45 adds
// allowed_callers and output_schema, not followed here). Each is null when the request
// does not give it; keys the SDK does not declare follow in request order. Their
// defer_loading is not among them: vLLM's FunctionDefinition declares it (PR #40190,
// before namespaces), after parameters, and drops it from the dump when null. The
// renderer then prints them as the newest vLLM's FunctionDefinition dumps them
// (tokenize/template's toolsValue: strict and defer_loading when not null, in that
// order, undeclared keys left out), as construct_tool_dicts dumps them through it.
var (
	functionToolFields  = []string{"strict"}
	namespaceToolFields = []string{"strict"}
)

// responsesTools converts the request's tools into chat tools (construct_tool_dicts):
// nil when there are none, an empty list when none is a function.
func (c *responsesConversion) tools(tools jsonv.Value) ([]jsonv.Value, error) {
	switch tools.Kind() {
	case jsonv.Null:
		return nil, nil
	case jsonv.Array:
		if tools.Len() == 0 {
			return nil, nil
		}
	default:
		return nil, notRendered("'tools' must be a list")
	}
	out := []jsonv.Value{}
	for _, t := range tools.Items() {
		typ, _ := t.Get("type")
		if typ.Kind() != jsonv.String {
			return nil, notRendered("a tool must be an object with a string type")
		}
		switch typ.Str() {
		case "function":
			name, _ := t.Get("name")
			tool, err := c.chatTool(t, name, functionToolFields)
			if err != nil {
				return nil, err
			}
			out = append(out, tool)
		case "namespace":
			ns, _ := t.Get("name")
			inner, _ := t.Get("tools")
			if desc, _ := t.Get("description"); ns.Kind() != jsonv.String || desc.Kind() != jsonv.String || inner.Kind() != jsonv.Array {
				return nil, notRendered("a namespace tool must have a string name and description and a list of tools")
			}
			for _, f := range inner.Items() {
				switch ft, _ := f.Get("type"); ft.Str() {
				case "function":
					name, _ := f.Get("name")
					if name.Kind() == jsonv.String {
						if err := c.charge(len(ns.Str()) + 2 + len(name.Str())); err != nil {
							return nil, err
						}
						name = jsonv.StringValue(ns.Str() + "__" + name.Str())
					}
					tool, err := c.chatTool(f, name, namespaceToolFields)
					if err != nil {
						return nil, err
					}
					out = append(out, tool)
				case "custom":
				default:
					return nil, notRendered("a namespace's tools must be function or custom tools")
				}
			}
		}
	}
	return out, nil
}

// chatTool converts a Responses function tool into the chat tool vLLM renders:
// {"type":"function","function":{name, description, parameters, defer_loading when
// set, the SDK's further fields, then the request's other keys}}. parameters must be an object or null
// (vLLM's FunctionDefinition).
func (c *responsesConversion) chatTool(t, name jsonv.Value, declared []string) (jsonv.Value, error) {
	description, _ := t.Get("description")
	parameters, _ := t.Get("parameters")
	if name.Kind() != jsonv.String || !optionalString(t, "description") ||
		parameters.Kind() != jsonv.Null && parameters.Kind() != jsonv.Object {
		return jsonv.Value{}, notRendered("a function tool must have a string name, and parameters an object or null")
	}
	keys, vals := c.scratch[:0], c.values[:0]
	keys = append(keys, "name", "description", "parameters")
	vals = append(vals, name, description, parameters)
	// FunctionDefinition's own defer_loading (Optional[bool], as the SDK's): kept
	// only when set.
	if v, _ := t.Get("defer_loading"); !v.IsNull() {
		b, ok := laxBool(v)
		if !ok {
			return jsonv.Value{}, notRendered("a function tool's defer_loading must be a boolean")
		}
		keys = append(keys, "defer_loading")
		vals = append(vals, jsonv.BoolValue(b))
	}
	for _, key := range declared {
		// Every declared field the SDK types as Optional[bool], read as pydantic's lax
		// bool reads it.
		v, _ := t.Get(key)
		if !v.IsNull() {
			b, ok := laxBool(v)
			if !ok {
				return jsonv.Value{}, notRendered("a function tool's %s must be a boolean", key)
			}
			v = jsonv.BoolValue(b)
		}
		keys = append(keys, key)
		vals = append(vals, v)
	}
	for i := range t.Len() {
		key, v := t.Member(i)
		if key == "type" || key == "name" || key == "description" || key == "parameters" || key == "defer_loading" ||
			slices.Contains(declared, key) {
			continue
		}
		keys = append(keys, key)
		vals = append(vals, v)
	}
	c.scratch, c.values = keys, vals
	// The function object, the tool's, and its element of the list (twice, for the
	// list's growth).
	if err := c.charge(2*valueBytes*len(keys) + 6*valueBytes); err != nil {
		return jsonv.Value{}, err
	}
	return object2("type", functionType, "function", jsonv.ObjectValue(keys, vals)), nil
}

// templateKwargs is the template kwargs of the latest vLLM's build_chat_params: the
// request's chat_template_kwargs, under vLLM's own (merge_kwargs(request's, vLLM's)):
// add_generation_prompt and continue_final_message, which the chat's flags carry (and
// which override the request's: set again after them when the request has them);
// reasoning_effort, reasoning.effort when set; and enable_thinking, true unless the
// effort is "none", when an effort is set and the request's kwargs have none. The zero
// Value when there are none.
func (c *responsesConversion) templateKwargs(reasoning, kwargs jsonv.Value, continueFinal bool) (jsonv.Value, error) {
	switch reasoning.Kind() {
	case jsonv.Null, jsonv.Object:
	default:
		return jsonv.Value{}, notRendered("'reasoning' must be an object")
	}
	effort, _ := reasoning.Get("effort")
	switch effort.Kind() {
	case jsonv.Null, jsonv.String:
	default:
		return jsonv.Value{}, notRendered("'reasoning.effort' must be a string")
	}
	switch kwargs.Kind() {
	case jsonv.Null, jsonv.Object:
	default:
		return jsonv.Value{}, notRendered("'chat_template_kwargs' must be an object")
	}
	if effort.IsNull() && kwargs.IsNull() {
		return jsonv.Value{}, nil
	}
	n := kwargs.Len()
	if err := c.charge(2 * valueBytes * (n + 4)); err != nil {
		return jsonv.Value{}, err
	}
	keys, vals := make([]string, 0, n+4), make([]jsonv.Value, 0, n+4)
	for i := range n {
		k, v := kwargs.Member(i)
		keys, vals = append(keys, k), append(vals, v)
	}
	// The renderer reads the kwargs in order, a later key overriding an earlier one.
	_, addGen := kwargs.Get("add_generation_prompt")
	_, cont := kwargs.Get("continue_final_message")
	if addGen || cont {
		keys = append(keys, "add_generation_prompt", "continue_final_message")
		vals = append(vals, jsonv.BoolValue(!continueFinal), jsonv.BoolValue(continueFinal))
	}
	keys, vals = appendEffortKwargs(keys, vals, effort, kwargs)
	return jsonv.ObjectValue(keys, vals), nil
}

// appendEffortKwargs appends to the kwargs keys and vals (the request's
// chat_template_kwargs, kwargs, first) the two vLLM sets from a reasoning effort, as
// the latest vLLM's build_chat_params does for both chat completions and responses:
// reasoning_effort, effort, over the request's (merge_kwargs keeps the request's when
// effort is null); and enable_thinking, true unless effort is "none", unless the
// request's kwargs have that key. effort is a string or null; null appends nothing.
// keys and vals need room for two more.
func appendEffortKwargs(keys []string, vals []jsonv.Value, effort, kwargs jsonv.Value) ([]string, []jsonv.Value) {
	if effort.IsNull() {
		return keys, vals
	}
	keys, vals = append(keys, "reasoning_effort"), append(vals, effort)
	if _, set := kwargs.Get("enable_thinking"); !set {
		keys, vals = append(keys, "enable_thinking"), append(vals, jsonv.BoolValue(effort.Str() != "none"))
	}
	return keys, vals
}
