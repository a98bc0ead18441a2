package tokenize

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAPIOf(t *testing.T) {
	chat := Prompt{Chat: TextChat("user", "hi")}
	text := Prompt{Text: "hi"}
	assert.Equal(t, APIChat, APIFromPrompt.Of(chat))
	assert.Equal(t, APICompletions, APIFromPrompt.Of(text))
	for _, a := range []API{APIChat, APICompletions, APIResponses, APIMessages} {
		assert.Equal(t, a, a.Of(chat), "a said API is the body's, whatever the prompt")
		assert.Equal(t, a, a.Of(text))
	}
	names := map[API]string{APIFromPrompt: "from_prompt", APIChat: "chat", APICompletions: "completions", APIResponses: "responses", APIMessages: "messages", APIGenerate: "generate", APISGLang: "sglang_generate", APISGLangCloseSession: "sglang_close_session", APISGLangOpenSession: "sglang_open_session", API(99): "unknown"}
	for a, name := range names {
		assert.Equal(t, name, a.String())
	}
}
