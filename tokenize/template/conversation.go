package template

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/jsonv"
)

// argumentsMaxDepth bounds the nesting of a tool call's arguments string when it is
// parsed into an object.
const argumentsMaxDepth = 128

// finalText is the text of the last message that continue_final_message continues.
type finalText struct {
	text string
	ok   bool
}

// conversation rebuilds the request's messages as vLLM hands them to the template
// (vllm/entrypoints/chat_utils.py: _parse_chat_message_content, _postprocess_messages):
// each message becomes a new object of role, content, then (assistant) tool_calls,
// reasoning and reasoning_content (both from reasoning, else from reasoning_content), (tool) tool_call_id, then name, task and (developer)
// tools; every other key of the request's message is dropped. It also returns the text
// continue_final_message would continue.
//
// A tool call keeps the request's keys in the request's order. vLLM validates tool calls
// with the openai package's TypedDicts, which may reorder them (id, function with
// arguments then name, type) and drop unknown keys; only a template that dumps a whole
// tool call with tojson could tell, and none of the tested templates does.
func conversation(msgs []jsonv.Value, format ContentFormat) ([]jinja.Value, finalText, error) {
	out := make([]jinja.Value, len(msgs))
	var final finalText
	for i, m := range msgs {
		role, _ := m.Get("role")
		if role.Kind() != jsonv.String {
			return nil, final, fmt.Errorf("%w: messages[%d].role must be a string", ErrRender, i)
		}
		content, err := messageContent(m, format)
		if err != nil {
			return nil, final, fmt.Errorf("messages[%d]: %w", i, err)
		}
		v := newDict(m.Len() + 1)
		d := v.AsDict()
		d.Set("role", jinja.NewString(role.Str()))
		d.Set("content", content)
		switch role.Str() {
		case "assistant":
			if calls, ok := m.Get("tool_calls"); ok && !calls.IsNull() {
				if err := setToolCalls(d, calls); err != nil {
					return nil, final, fmt.Errorf("messages[%d]: %w", i, err)
				}
			}
			if r, ok := reasoning(m); ok {
				d.Set("reasoning", toValue(r))
				d.Set("reasoning_content", toValue(r))
			}
		case "tool":
			if id, ok := m.Get("tool_call_id"); ok {
				d.Set("tool_call_id", toValue(id))
			}
			if content.IsList() {
				d.Set("content", toolContent(content))
			}
		}
		if name, ok := m.Get("name"); ok && name.Kind() == jsonv.String {
			d.Set("name", jinja.NewString(name.Str()))
		}
		if task, ok := m.Get("task"); ok && task.Kind() == jsonv.String {
			d.Set("task", jinja.NewString(task.Str()))
		}
		if role.Str() == "developer" {
			tools, _ := m.Get("tools")
			d.Set("tools", toValue(tools))
		}
		out[i] = v
		if i == len(msgs)-1 {
			final = lastText(d)
		}
	}
	return out, final, nil
}

// reasoning is an assistant message's reasoning: its reasoning, or when that is absent
// or null its reasoning_content, the field's former name, which vLLM's request model
// renames to reasoning before anything reads the message (_normalize_messages_before).
func reasoning(m jsonv.Value) (jsonv.Value, bool) {
	if r, ok := m.Get("reasoning"); ok && !r.IsNull() {
		return r, true
	}
	if r, ok := m.Get("reasoning_content"); ok && !r.IsNull() {
		return r, true
	}
	return jsonv.Value{}, false
}

// messageContent is a message's content as vLLM passes it: in the string format the
// text of its parts joined with "\n" ("" for null content), empty texts left out; in the
// openai format a list of {"type": "text", "text": …} parts (a string content becomes
// one part), empty ones kept. vLLM keeps a part's parse only when it is truthy
// (_parse_chat_message_content_parts: "if parse_res"): a string in the string format,
// a dict in the openai format.
func messageContent(m jsonv.Value, format ContentFormat) (jinja.Value, error) {
	raw, _ := m.Get("content")
	var parts []jsonv.Value
	switch raw.Kind() {
	case jsonv.Null:
	case jsonv.String:
		parts = []jsonv.Value{raw}
	case jsonv.Array:
		parts = raw.Items()
	default:
		return jinja.Value{}, fmt.Errorf("%w: content must be a string, an array of parts or null", ErrRender)
	}
	texts := make([]string, 0, len(parts))
	items := make([]jinja.Value, 0, len(parts))
	for _, p := range parts {
		typ, text, skip, err := contentPart(p)
		if err != nil {
			return jinja.Value{}, err
		}
		if skip {
			continue
		}
		if format == ContentOpenAI {
			key := "text"
			if typ == "tool_reference" {
				key = "name"
			}
			part := newDict(2)
			part.AsDict().Set("type", jinja.NewString(typ))
			part.AsDict().Set(key, jinja.NewString(text))
			items = append(items, part)
			continue
		}
		if text != "" {
			texts = append(texts, text)
		}
	}
	if format == ContentOpenAI {
		return jinja.NewList(items), nil
	}
	return jinja.NewString(strings.Join(texts, "\n")), nil
}

// contentPart reads one content part: its type for the openai format ("text" or
// "tool_reference") and its text. skip reports a text or refusal part whose text is
// null, which vLLM skips.
func contentPart(p jsonv.Value) (typ, text string, skip bool, err error) {
	if p.Kind() == jsonv.String {
		return "text", p.Str(), false, nil
	}
	if p.Kind() != jsonv.Object {
		return "", "", false, fmt.Errorf("%w: a content part must be an object or a string", ErrRender)
	}
	t, _ := p.Get("type")
	if _, hasUUID := p.Get("uuid"); t.Kind() != jsonv.String || hasUUID {
		// vLLM reads a part without type (or with a media uuid) as media by its keys.
		return "", "", false, fmt.Errorf("%w: content part without a text type", ErrUnsupportedContent)
	}
	key := ""
	switch t.Str() {
	case "text", "input_text", "output_text":
		key = "text"
	case "refusal":
		key = "refusal"
	case "thinking":
		key = "thinking"
	case "tool_reference":
		key = "name"
	case "image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio",
		"audio_embeds", "video_url", "prompt_embeds":
		return "", "", false, fmt.Errorf("%w: %q content part", ErrUnsupportedContent, t.Str())
	default:
		return "", "", false, fmt.Errorf("%w: unsupported content part type %q", ErrRender, t.Str())
	}
	v, _ := p.Get(key)
	switch v.Kind() {
	case jsonv.String:
	case jsonv.Null:
		if t.Str() == "text" || t.Str() == "refusal" {
			return "", "", true, nil
		}
		fallthrough
	default:
		return "", "", false, fmt.Errorf("%w: %q content part: %q must be a string", ErrRender, t.Str(), key)
	}
	typ = "text"
	if t.Str() == "tool_reference" {
		typ = "tool_reference"
	}
	return typ, v.Str(), false, nil
}

// toolContent is a tool message's content list as vLLM normalises it: joined text when
// every part is text, else the list as is.
func toolContent(content jinja.Value) jinja.Value {
	items := content.AsList().Items
	texts := make([]string, 0, len(items))
	for _, it := range items {
		typ, _ := it.AsDict().Get("type")
		if !typ.IsString() || typ.AsString() != "text" {
			return content
		}
		text, _ := it.AsDict().Get("text")
		texts = append(texts, text.AsString())
	}
	return jinja.NewString(strings.Join(texts, "\n"))
}

// setToolCalls sets an assistant message's tool_calls: dropped when empty, each call's
// function.arguments parsed from its JSON string ({} when it is not valid JSON or is
// neither a string, an object nor an array).
func setToolCalls(d *jinja.Dict, calls jsonv.Value) error {
	if calls.Kind() != jsonv.Array {
		d.Set("tool_calls", toValue(calls))
		return nil
	}
	if calls.Len() == 0 {
		return nil
	}
	items := make([]jinja.Value, calls.Len())
	for j, call := range calls.Items() {
		fn, ok := call.Get("function")
		if !ok || fn.Kind() != jsonv.Object {
			return fmt.Errorf("%w: tool_calls[%d] has no function object", ErrRender, j)
		}
		cv := jinja.NewDict()
		for k := range call.Len() {
			key, val := call.Member(k)
			if key != "function" {
				cv.AsDict().Set(key, toValue(val))
				continue
			}
			fv := toValue(fn)
			fv.AsDict().Set("arguments", arguments(fn))
			cv.AsDict().Set(key, fv)
		}
		items[j] = cv
	}
	d.Set("tool_calls", jinja.NewList(items))
	return nil
}

// arguments is a tool call's arguments as vLLM passes them to the template.
func arguments(fn jsonv.Value) jinja.Value {
	args, _ := fn.Get("arguments")
	switch args.Kind() {
	case jsonv.String:
		parsed, err := jsonv.Parse([]byte(args.Str()), argumentsMaxDepth)
		if err != nil {
			return jinja.NewDict()
		}
		return toValue(parsed)
	case jsonv.Object, jsonv.Array:
		return toValue(args)
	}
	return jinja.NewDict()
}

// lastText is the text continue_final_message continues: the content string, or the
// text of the last part that has one.
func lastText(d *jinja.Dict) finalText {
	content, _ := d.Get("content")
	switch {
	case content.IsString():
		return finalText{text: content.AsString(), ok: true}
	case content.IsList():
		items := content.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			if !items[i].IsDict() {
				continue
			}
			if text, ok := items[i].AsDict().Get("text"); ok && text.IsString() {
				return finalText{text: text.AsString(), ok: true}
			}
		}
	}
	return finalText{}
}

// toolsValue shapes the request's tools as the newest vLLM's pydantic models dump them
// (ChatCompletionToolsParam.model_dump(), chat_completion/protocol.py at 002032ee2b18,
// FunctionDefinition in generate/base/protocol.py): the tool's type ("function" by
// default), its function, then its defer_loading when not null; the function's name,
// description and parameters (null when absent), strict when not null, then
// defer_loading when not null (the function's, else the tool's, which its validator
// copies in). Keys the models do not declare are left out (their serializers keep only
// model_fields). Tools of another shape (not of type function, no function object with
// a string name: a 400 in vLLM) pass as is.
func toolsValue(tools []jsonv.Value) jinja.Value {
	items := make([]jinja.Value, len(tools))
	for i, t := range tools {
		items[i] = toolValue(t)
	}
	return jinja.NewList(items)
}

func toolValue(t jsonv.Value) jinja.Value {
	typ, hasType := t.Get("type")
	fn, _ := t.Get("function")
	name, _ := fn.Get("name")
	if (hasType && typ.Str() != "function") || typ.Kind() != jsonv.String && hasType ||
		fn.Kind() != jsonv.Object || name.Kind() != jsonv.String {
		return toValue(t)
	}
	fv := jinja.NewDict()
	f := fv.AsDict()
	for _, key := range []string{"name", "description", "parameters"} {
		v, _ := fn.Get(key)
		f.Set(key, toValue(v))
	}
	if v, _ := fn.Get("strict"); !v.IsNull() {
		f.Set("strict", toValue(v))
	}
	deferLoading, _ := t.Get("defer_loading")
	if v, _ := fn.Get("defer_loading"); !v.IsNull() {
		f.Set("defer_loading", toValue(v))
	} else if !deferLoading.IsNull() {
		f.Set("defer_loading", toValue(deferLoading))
	}
	tv := jinja.NewDict()
	tv.AsDict().Set("type", jinja.NewString("function"))
	tv.AsDict().Set("function", fv)
	if !deferLoading.IsNull() {
		tv.AsDict().Set("defer_loading", toValue(deferLoading))
	}
	return tv
}
