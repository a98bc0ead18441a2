package tokenize

import (
	"errors"
	"strings"
)

// Message is one chat message as the engine's template sees it. Content holds the
// message's text parts already joined with "\n", as vLLM joins them.
type Message struct {
	Role    string
	Content string
}

// ChatRenderer renders chat messages into the prompt text the engine would tokenize.
type ChatRenderer interface {
	Render(messages []Message) (string, error)
}

// ErrNoMessages is returned when a chat has no messages to render.
var ErrNoMessages = errors.New("tokenize: chat has no messages")

// ChatML renders messages in the ChatML layout used by Qwen and many other templates:
// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then the generation prompt
// "<|im_start|>assistant\n" as vLLM adds by default. A conversation and its continuation
// therefore render to texts where the first is a prefix of the second, up to the
// generation prompt. The zero value is ready to use.
type ChatML struct{}

var _ ChatRenderer = ChatML{}

// Render implements [ChatRenderer].
func (ChatML) Render(messages []Message) (string, error) {
	if len(messages) == 0 {
		return "", ErrNoMessages
	}
	n := len("<|im_start|>assistant\n")
	for _, m := range messages {
		n += len("<|im_start|>\n<|im_end|>\n") + len(m.Role) + len(m.Content)
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String(), nil
}
