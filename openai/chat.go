package openai

import (
	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// readChat checks a chat request's fields and builds the chat its template renders.
// Fields over the value budget are not checked, and the chat holds none of the four
// (Unread): the renderers refuse it, and the request is routed by load alone.
//
// The template kwargs are the request's chat_template_kwargs with, when the request
// has a reasoning_effort (a string; null is none), reasoning_effort over the request's
// and enable_thinking (effort not "none") unless the request's kwargs set it, as the
// latest vLLM's ChatCompletionRequest.build_chat_params merges them. The rest of that
// merge is the renderer's (tokenize/template): the request's add_generation_prompt and
// continue_final_message win over the kwargs' and its documents do when set, and kwargs
// null or "auto" are dropped.
func readChat(messages, tools, documents, kwargs chatField, addGen, cont, effort jsonv.Value) (*tokenize.Chat, error) {
	chat := &tokenize.Chat{}
	if !messages.unread {
		if err := checkMessages(messages.v); err != nil {
			return nil, err
		}
		chat.Messages = messages.v.Items()
	}
	var err error
	if !tools.unread {
		if chat.Tools, err = objects(tools.v, "tools"); err != nil {
			return nil, err
		}
	}
	if !documents.unread {
		if chat.Documents, err = objects(documents.v, "documents"); err != nil {
			return nil, err
		}
	}
	if !kwargs.unread {
		switch kwargs.v.Kind() {
		case jsonv.Null:
		case jsonv.Object:
			chat.TemplateKwargs = kwargs.v
		default:
			return nil, badField("chat_template_kwargs", "'chat_template_kwargs' must be an object")
		}
	}
	switch effort.Kind() {
	case jsonv.Null:
	case jsonv.String:
		if !kwargs.unread {
			n := chat.TemplateKwargs.Len()
			keys, vals := make([]string, 0, n+2), make([]jsonv.Value, 0, n+2)
			for i := range n {
				k, v := chat.TemplateKwargs.Member(i)
				keys, vals = append(keys, k), append(vals, v)
			}
			keys, vals = appendEffortKwargs(keys, vals, effort, chat.TemplateKwargs)
			chat.TemplateKwargs = jsonv.ObjectValue(keys, vals)
		}
	default:
		return nil, badField("reasoning_effort", "'reasoning_effort' must be a string")
	}
	if chat.AddGenerationPrompt, err = optionalBool(addGen, "add_generation_prompt", true); err != nil {
		return nil, err
	}
	if chat.ContinueFinalMessage, err = optionalBool(cont, "continue_final_message", false); err != nil {
		return nil, err
	}
	if chat.AddGenerationPrompt && chat.ContinueFinalMessage {
		// vLLM refuses the combination: the prompt cannot both open a new assistant turn
		// and continue the last message.
		return nil, badField("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true")
	}
	if messages.unread || tools.unread || documents.unread || kwargs.unread {
		return &tokenize.Chat{Unread: errChatUnread, AddGenerationPrompt: chat.AddGenerationPrompt,
			ContinueFinalMessage: chat.ContinueFinalMessage}, nil
	}
	return chat, nil
}

// checkMessages checks that messages is a non-empty array of messages.
func checkMessages(messages jsonv.Value) error {
	if messages.Kind() != jsonv.Array {
		return badField("messages", "'messages' is required and must be an array")
	}
	if messages.Len() == 0 {
		return badField("messages", "'messages' must contain at least one message")
	}
	for i, m := range messages.Items() {
		if err := checkMessage(i, m); err != nil {
			return err
		}
	}
	return nil
}

// checkMessage checks the fields routing and templates read: a string role, content a
// string, null or an array of parts (objects, or strings that vLLM reads as text parts),
// tool_calls an array of objects.
func checkMessage(i int, m jsonv.Value) error {
	if m.Kind() != jsonv.Object {
		return badField("messages", "messages[%d] must be an object", i)
	}
	if role, _ := m.Get("role"); role.Kind() != jsonv.String || role.Str() == "" {
		return badField("messages", "messages[%d].role is required and must be a string", i)
	}
	switch content, _ := m.Get("content"); content.Kind() {
	case jsonv.Null, jsonv.String:
	case jsonv.Array:
		for _, part := range content.Items() {
			if part.Kind() == jsonv.String {
				continue // a text part, as vLLM reads a plain string part
			}
			if part.Kind() != jsonv.Object {
				return badField("messages", "messages[%d].content parts must be objects or strings", i)
			}
			if typ, _ := part.Get("type"); typ.Str() == "text" {
				if text, _ := part.Get("text"); text.Kind() != jsonv.String {
					return badField("messages", "messages[%d].content: a text part's 'text' must be a string", i)
				}
			}
		}
	default:
		return badField("messages", "messages[%d].content must be a string, an array of parts or null", i)
	}
	if calls, _ := m.Get("tool_calls"); !calls.IsNull() {
		if calls.Kind() != jsonv.Array {
			return badField("messages", "messages[%d].tool_calls must be an array", i)
		}
		for _, c := range calls.Items() {
			if c.Kind() != jsonv.Object {
				return badField("messages", "messages[%d].tool_calls entries must be objects", i)
			}
		}
	}
	return nil
}

// objects checks an optional array of objects (tools, documents).
func objects(v jsonv.Value, name string) ([]jsonv.Value, error) {
	switch v.Kind() {
	case jsonv.Null:
		return nil, nil
	case jsonv.Array:
		for _, it := range v.Items() {
			if it.Kind() != jsonv.Object {
				return nil, badField(name, "'%s' must be an array of objects", name)
			}
		}
		if v.Len() == 0 {
			// An empty list is not an absent one: templates test `tools is not none`,
			// and transformers picks a tool_use template for any list.
			return []jsonv.Value{}, nil
		}
		return v.Items(), nil
	}
	return nil, badField(name, "'%s' must be an array of objects", name)
}
