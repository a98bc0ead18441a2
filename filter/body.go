package filter

import (
	"strings"

	"github.com/tidwall/gjson"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// endpoint is the kind of OpenAI API a path serves.
type endpoint int

const (
	chatCompletions endpoint = iota + 1
	completions
)

// parsedBody is what the filter reads from an OpenAI request body.
type parsedBody struct {
	request router.Request
	stream  bool
}

// parseBody validates an OpenAI request body and extracts what routing needs. It never
// panics on any input; every rejection is a *fieldError naming the field.
func parseBody(kind endpoint, body []byte) (parsedBody, error) {
	if len(body) == 0 {
		return parsedBody{}, badField("", "request body is empty: expected a JSON object")
	}
	if !gjson.ValidBytes(body) {
		return parsedBody{}, badField("", "request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return parsedBody{}, badField("", "request body must be a JSON object")
	}
	var out parsedBody
	model := root.Get("model")
	if model.Type != gjson.String || model.Str == "" {
		return parsedBody{}, badField("model", "'model' is required and must be a non-empty string")
	}
	out.request.Model = model.Str
	if s := root.Get("stream"); s.Exists() && s.Type != gjson.Null {
		if s.Type != gjson.True && s.Type != gjson.False {
			return parsedBody{}, badField("stream", "'stream' must be a boolean")
		}
		out.stream = s.Bool()
	}
	if salt := root.Get("cache_salt"); salt.Exists() && salt.Type != gjson.Null {
		if salt.Type != gjson.String {
			return parsedBody{}, badField("cache_salt", "'cache_salt' must be a string")
		}
		out.request.CacheSalt = salt.Str
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		if v := root.Get(name); v.Exists() && v.Type != gjson.Null && (v.Type != gjson.Number || v.Num < 0) {
			return parsedBody{}, badField(name, "'%s' must be a non-negative integer", name)
		}
	}
	var err error
	switch kind {
	case chatCompletions:
		out.request.Messages, err = parseMessages(root.Get("messages"))
	case completions:
		out.request.Prompt, out.request.Tokens, err = parsePrompt(root.Get("prompt"))
	}
	return out, err
}

// parseMessages reads a chat's messages. Text parts of a content array are joined with
// "\n" as vLLM does; tool calls are kept as their JSON so different calls differ.
func parseMessages(messages gjson.Result) ([]tokenize.Message, error) {
	if !messages.IsArray() {
		return nil, badField("messages", "'messages' is required and must be an array")
	}
	var out []tokenize.Message
	var err error
	messages.ForEach(func(key, m gjson.Result) bool {
		i := int(key.Int())
		if !m.IsObject() {
			err = badField("messages", "messages[%d] must be an object", i)
			return false
		}
		role := m.Get("role")
		if role.Type != gjson.String || role.Str == "" {
			err = badField("messages", "messages[%d].role is required and must be a string", i)
			return false
		}
		var content string
		content, err = messageContent(m.Get("content"), i)
		if err != nil {
			return false
		}
		if calls := m.Get("tool_calls"); calls.IsArray() && len(calls.Array()) > 0 {
			content += calls.Raw
		}
		out = append(out, tokenize.Message{Role: role.Str, Content: content})
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, badField("messages", "'messages' must contain at least one message")
	}
	return out, nil
}

func messageContent(content gjson.Result, i int) (string, error) {
	switch {
	case !content.Exists() || content.Type == gjson.Null:
		return "", nil
	case content.Type == gjson.String:
		return content.Str, nil
	case content.IsArray():
		var parts []string
		var err error
		content.ForEach(func(_, part gjson.Result) bool {
			if !part.IsObject() {
				err = badField("messages", "messages[%d].content parts must be objects", i)
				return false
			}
			if part.Get("type").Str == "text" {
				parts = append(parts, part.Get("text").Str)
			}
			return true
		})
		return strings.Join(parts, "\n"), err
	default:
		return "", badField("messages", "messages[%d].content must be a string, an array of parts or null", i)
	}
}

// parsePrompt reads a completions prompt: a string, an array of token ids, or a batch
// of either. A batch is routed by its first prompt: the engine serves the batch on one
// worker, and the first prompt is the one whose prefix is most likely shared.
func parsePrompt(prompt gjson.Result) (string, []uint32, error) {
	switch {
	case prompt.Type == gjson.String:
		return prompt.Str, nil, nil
	case prompt.IsArray():
		items := prompt.Array()
		if len(items) == 0 {
			return "", nil, badField("prompt", "'prompt' must not be an empty array")
		}
		switch first := items[0]; {
		case first.Type == gjson.String:
			return first.Str, nil, nil
		case first.Type == gjson.Number:
			ids, err := tokenIDs(items)
			return "", ids, err
		case first.IsArray():
			ids, err := tokenIDs(first.Array())
			return "", ids, err
		}
	}
	return "", nil, badField("prompt", "'prompt' is required: a string, an array of strings, or token ids")
}

func tokenIDs(items []gjson.Result) ([]uint32, error) {
	if len(items) == 0 {
		return nil, badField("prompt", "a token-id prompt must not be empty")
	}
	ids := make([]uint32, len(items))
	for i, it := range items {
		if it.Type != gjson.Number || it.Num < 0 || it.Num > 1<<32-1 || it.Num != float64(uint32(it.Num)) {
			return nil, badField("prompt", "token ids must be integers in [0, 2^32)")
		}
		ids[i] = uint32(it.Num)
	}
	return ids, nil
}
