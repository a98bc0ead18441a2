package openai

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// chatDump is a chat as text, to compare two conversions.
func chatDump(c *tokenize.Chat) string {
	if c != nil && c.Folded != nil {
		return chatDump(&tokenize.Chat{Messages: c.Messages, Tools: c.Tools, TemplateKwargs: c.TemplateKwargs,
			AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinalMessage}) + " folded: " + chatDump(c.Folded)
	}
	if c == nil {
		return "<nil>"
	}
	dump := valuesJSON(c.Messages) + " " + valuesJSON(c.Tools) + " " + string(c.TemplateKwargs.AppendCompact(nil))
	if c.AddGenerationPrompt {
		dump += " add"
	}
	if c.ContinueFinalMessage {
		dump += " continue"
	}
	return dump
}

// FuzzResponsesChat feeds arbitrary bodies to ResponsesChat: it never panics, gives the
// same result every time, refuses exactly the bodies ParseResponses refuses and with
// the same *FieldError, declines others only with ErrResponsesNotRendered, and an
// accepted body gives at least one message, each an object with a string role, and
// exactly one of the generation prompt and the continued final message.
func FuzzResponsesChat(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi"}`,
		`{"model":"m","instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}]}`,
		`{"model":"m","input":[{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"s"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x"}]},{"type":"function_call","call_id":"c","name":"f","namespace":"n","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"model":"m","input":[{"type":"message","role":"assistant","id":"i","status":"in_progress","content":[{"type":"output_text","text":"p"}]}],"reasoning":{"effort":"low"}}`,
		`{"model":"m","input":"x","tools":[{"type":"function","name":"f","strict":1,"z":null},{"type":"namespace","name":"n","description":"","tools":[{"type":"function","name":"g"},{"type":"custom","name":"c"}]},{"type":"web_search"}]}`,
		`{"model":"m","input":"x","previous_response_id":"resp_1"}`,
		`{"model":"m","input":[{"type":"reasoning","id":"r","summary":[],"encrypted_content":"e"}]}`,
		`{"model":"m","input":[{"type":"item_reference","id":"x"}]}`,
		`{"model":"m","input":[]}`, `{"model":"m"}`, `{"model":1,"input":"x"}`, `{"model":"m","input":"x","store":[]}`,
		`{"model":"m","input":"x","reasoning":{"effort":"none"},"chat_template_kwargs":{"enable_thinking":true,"add_generation_prompt":false}}`,
		`{"model":"m","input":"x","chat_template_kwargs":[]}`,
		`{"model":"m","input":"x","cache_salt":7}`, `{"model":"m","input":"x","cache_salt":"s"}`,
		`{"model":"m","input":[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}`, `{`, ``, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		chat, err := ResponsesChat([]byte(body), lim)
		again, againErr := ResponsesChat([]byte(body), lim)
		if chatDump(chat) != chatDump(again) || (err == nil) != (againErr == nil) || err != nil && err.Error() != againErr.Error() {
			t.Fatalf("two conversions differ: %s, %v and %s, %v", chatDump(chat), err, chatDump(again), againErr)
		}
		_, parseErr := ParseResponses([]byte(body), lim)
		if parseErr != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || err.Error() != parseErr.Error() {
				t.Fatalf("ParseResponses refused with %v, ResponsesChat gave %v", parseErr, err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, ErrResponsesNotRendered) || errors.Is(err, ErrBadRequest) || chat != nil {
				t.Fatalf("a body ParseResponses accepts was declined with %v (chat %s)", err, chatDump(chat))
			}
			return
		}
		if len(chat.Messages) == 0 {
			t.Fatal("an accepted body gave no message")
		}
		for i, m := range chat.Messages {
			if role, _ := m.Get("role"); m.Kind() != jsonv.Object || role.Kind() != jsonv.String {
				t.Fatalf("message %d is not an object with a string role: %s", i, m.AppendCompact(nil))
			}
		}
		if chat.AddGenerationPrompt == chat.ContinueFinalMessage || chat.Unread != nil {
			t.Fatalf("bad flags: %s, unread %v", chatDump(chat), chat.Unread)
		}
		if _, err := (tokenize.ChatML{}).Render(chat); err != nil {
			t.Fatalf("ChatML refused an accepted chat: %v", err)
		}
	})
}
