package tokenize

import (
	"errors"
	"strings"

	"github.com/kvroute/kvroute/jsonv"
)

// Chat is a chat-completions request as an engine's chat template sees it. Messages,
// tools and documents are the request's own JSON values, keys in request order (a
// template's tojson must reproduce them); the filter has checked their shape: each
// message is an object with a string role, its content a string, null or an array of
// parts (objects, or strings vLLM reads as text). Renderers apply the engine's message preprocessing themselves (vLLM joins
// text parts with "\n" and parses tool-call arguments), so no information is lost before
// the template.
type Chat struct {
	// Messages are the request's messages, in order; at least one.
	Messages []jsonv.Value
	// Tools and Documents are the request's tools and documents; nil when absent (or
	// null), empty but not nil for an empty list.
	Tools, Documents []jsonv.Value
	// TemplateKwargs is chat_template_kwargs: an object, or the zero Value when absent.
	TemplateKwargs jsonv.Value
	// AddGenerationPrompt ends the prompt with the assistant turn's opening, as vLLM does
	// unless the request sets add_generation_prompt to false.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the last (assistant) message open for the model to
	// continue, instead of closing it (continue_final_message).
	ContinueFinalMessage bool
	// ToolChoiceNone is set when vLLM reads the request's tool_choice as "none": a chat
	// completion's tool_choice "none", or absent with no tools or an empty list (the
	// field's default; tools given without one make it "auto"); a Responses request's
	// tool_choice "none"; an Anthropic Messages request's {"type":"none"}. vLLM renders
	// Tools whatever it says unless the server runs with
	// --exclude-tools-when-tool-choice-none, which renders such a chat without its tools
	// (tool_dicts None). That flag is the server's, so renderers ignore this field: the
	// encoder that knows the model's setting (tokenize/models, the entry's
	// exclude_tools_when_tool_choice_none) drops Tools before rendering.
	ToolChoiceNone bool
	// Unread, when set, is why the in-process renderers cannot render the chat: the
	// parser did not materialise Messages, Tools, Documents and TemplateKwargs (a body
	// of so many tiny JSON values that they would take several times its size; they
	// are then empty although the request has them), or the request names its own
	// chat_template, which the engine renders it with or refuses it for (an error
	// wrapping ErrUnsupported). Renderers return it as their error, so the request is
	// routed without its prompt; an encoder that hands the engine the request body
	// itself needs none of them.
	Unread error
	// Folded, when set, is the same request as vLLM renders it in its "fold" mode for
	// inline system messages (an Anthropic Messages body's system messages after the
	// conversation's start, merged into a neighbouring message), the chat itself being
	// its "preserve" mode (kept in place as system turns). vLLM picks the mode per
	// model, by probing the chat template it serves; so does the encoder that knows the
	// model's template (tokenize/models), which renders Folded instead of the chat when
	// the mode is fold. An encoder that knows no mode renders the chat itself. nil when
	// both modes give the same chat (no inline system message with text, or none vLLM
	// keeps in place: a request with no system prompt folds in either mode). Folded's
	// own Folded is nil.
	Folded *Chat
}

// TextMessage returns the message {"role": role, "content": content}.
func TextMessage(role, content string) jsonv.Value {
	return jsonv.ObjectValue([]string{"role", "content"}, []jsonv.Value{jsonv.StringValue(role), jsonv.StringValue(content)})
}

// TextChat returns a chat of text messages given as role, content, role, content…, with
// the generation prompt, as a client's plain chat request is. It panics on an odd count.
func TextChat(roleContent ...string) *Chat {
	if len(roleContent)%2 != 0 {
		panic("tokenize: TextChat needs role, content pairs")
	}
	c := &Chat{AddGenerationPrompt: true}
	for i := 0; i < len(roleContent); i += 2 {
		c.Messages = append(c.Messages, TextMessage(roleContent[i], roleContent[i+1]))
	}
	return c
}

// ChatRenderer renders a chat into the prompt text the engine would tokenize.
type ChatRenderer interface {
	Render(chat *Chat) (string, error)
}

// AppendRenderer is a [ChatRenderer] that can append the prompt to the caller's
// buffer, which [Pipeline] uses when the caller brings [Buffers].
type AppendRenderer interface {
	AppendRender(dst []byte, chat *Chat) ([]byte, error)
}

// ErrNoMessages is returned when a chat has no messages to render.
var ErrNoMessages = errors.New("tokenize: chat has no messages")

// ContentText returns a message's content as text: a string as is, the text parts (and
// plain string parts) of a content array joined with "\n" (vLLM's preprocessing), ""
// for null or absent.
func ContentText(message jsonv.Value) string {
	content, _ := message.Get("content")
	switch content.Kind() {
	case jsonv.String:
		return content.Str()
	case jsonv.Array:
		var parts []string
		for _, part := range content.Items() {
			if part.Kind() == jsonv.String {
				parts = append(parts, part.Str())
			} else if typ, _ := part.Get("type"); typ.Str() == "text" {
				text, _ := part.Get("text")
				parts = append(parts, text.Str())
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}

// ChatML renders messages in the ChatML layout used by Qwen and many other templates:
// "<|im_start|>{role}\n{content}<|im_end|>\n" per message (a message's tool calls
// follow its content as compact JSON), then the generation prompt
// "<|im_start|>assistant\n". A conversation and its continuation therefore render to
// texts where the first is a prefix of the second, up to the generation prompt. It is
// the file-free renderer paired with [Approx]; exact templates render with the model's
// own Jinja template. The zero value is ready to use.
type ChatML struct{}

var _ ChatRenderer = ChatML{}

// Render implements [ChatRenderer].
func (ChatML) Render(chat *Chat) (string, error) {
	if chat.Unread != nil {
		return "", chat.Unread
	}
	if len(chat.Messages) == 0 {
		return "", ErrNoMessages
	}
	var b strings.Builder
	b.Grow(chatMLSize(chat))
	for i, m := range chat.Messages {
		role, _ := m.Get("role")
		b.WriteString("<|im_start|>")
		b.WriteString(role.Str())
		b.WriteByte('\n')
		b.WriteString(ContentText(m))
		if calls, _ := m.Get("tool_calls"); calls.Len() > 0 {
			b.Write(calls.AppendCompact(nil))
		}
		if chat.ContinueFinalMessage && i == len(chat.Messages)-1 {
			return b.String(), nil
		}
		b.WriteString("<|im_end|>\n")
	}
	if chat.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}

// chatMLSize is the length of ChatML's rendering of chat when every content is a string
// (a lower bound otherwise), so the text is built in one allocation instead of growing
// by doubling: a 4k-token chat is 16 KiB of text.
func chatMLSize(chat *Chat) int {
	const perMessage = len("<|im_start|>\n<|im_end|>\n")
	n := len("<|im_start|>assistant\n")
	for _, m := range chat.Messages {
		role, _ := m.Get("role")
		content, _ := m.Get("content")
		n += perMessage + len(role.Str()) + len(content.Str())
	}
	return n
}
