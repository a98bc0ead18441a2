package openai

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
)

// FuzzMessagesChat feeds arbitrary bodies to MessagesChat: it never panics, gives the
// same result every time, refuses exactly the bodies ParseMessages refuses and with the
// same *FieldError, declines others only with ErrMessagesNotRendered, and an accepted
// body gives at least one message, each an object with a string role, the generation
// prompt, and a chat ChatML renders. Every tool call's arguments read back as JSON. So
// does the chat of vLLM's fold mode (Folded) when it differs, which has no system
// message but the first, and no Folded of its own.
func FuzzMessagesChat(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"S"}],"messages":[{"role":"system","content":"L"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"redacted_thinking","data":"d"},{"type":"text","text":"x"},{"type":"tool_use","id":"i","name":"f","input":{"a":[1.5,-0,1e300,"é😀\u007f"],"b":{}}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":[{"type":"text","text":"o"},{"type":"text"},{"type":"tool_reference"}],"is_error":1},{"type":"text","text":"next"}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_result","content":"r"}]}],"tools":[{"name":"f","input_schema":{"properties":{}},"strict":"yes","defer_loading":true}],"tool_choice":{"type":"tool","name":"f"}}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"output_config":{"effort":"high"},"chat_template_kwargs":{"enable_thinking":false},"thinking":{"type":"adaptive"}}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"thinking":{"type":"disabled"}}`,
		`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"system","content":"late"}]}`,
		`{"model":"m","system":"S","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"text","text":"t"},{"type":"tool_use","id":"c","name":"f","input":{}}]},{"role":"system","content":"between"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":[{"type":"text","text":"o"}]},{"type":"text","text":"go"}]},{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"n"}]},{"role":"assistant","content":"a"},{"role":"system","content":"p"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c"}]},{"role":"system","content":"t"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"L"},{"role":"user","content":[]},{"role":"system","content":"n"},{"role":"assistant","content":"a"},{"role":"system","content":""},{"role":"system","content":"m"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"x"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"document"}]}]}`,
		`{"model":"m","messages":[]}`, `{"model":"m"}`, `{"model":1,"messages":[]}`, `{"model":"m","stream":[]}`,
		`{"model":"m","cache_salt":7}`, `{"model":"m","max_tokens":-3}`,
		`{"model":"m","messages":[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}`, `{`, ``, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		chat, err := MessagesChat([]byte(body), lim)
		again, againErr := MessagesChat([]byte(body), lim)
		if chatDump(chat) != chatDump(again) || (err == nil) != (againErr == nil) || err != nil && err.Error() != againErr.Error() {
			t.Fatalf("two conversions differ: %s, %v and %s, %v", chatDump(chat), err, chatDump(again), againErr)
		}
		_, parseErr := ParseMessages([]byte(body), lim)
		if parseErr != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || err.Error() != parseErr.Error() {
				t.Fatalf("ParseMessages refused with %v, MessagesChat gave %v", parseErr, err)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, ErrMessagesNotRendered) || errors.Is(err, ErrBadRequest) || chat != nil {
				t.Fatalf("a body ParseMessages accepts was declined with %v (chat %s)", err, chatDump(chat))
			}
			return
		}
		checkMessagesChat(t, chat)
		if chat.Folded != nil {
			checkMessagesChat(t, chat.Folded)
			if chat.Folded.Folded != nil {
				t.Fatal("Folded has a Folded")
			}
			for i, m := range chat.Folded.Messages[1:] {
				if role, _ := m.Get("role"); role.Str() == "system" {
					t.Fatalf("folded message %d is a system message", i+1)
				}
			}
		}
	})
}

// checkMessagesChat checks an accepted body's chat.
func checkMessagesChat(t *testing.T, chat *tokenize.Chat) {
	t.Helper()
	{
		if len(chat.Messages) == 0 {
			t.Fatal("an accepted body gave no message")
		}
		for i, m := range chat.Messages {
			if role, _ := m.Get("role"); m.Kind() != jsonv.Object || role.Kind() != jsonv.String {
				t.Fatalf("message %d is not an object with a string role: %s", i, m.AppendCompact(nil))
			}
			calls, _ := m.Get("tool_calls")
			for _, c := range calls.Items() {
				fn, _ := c.Get("function")
				args, _ := fn.Get("arguments")
				if _, err := jsonv.Parse([]byte(args.Str()), 64); err != nil {
					t.Fatalf("message %d: arguments %q are not JSON: %v", i, args.Str(), err)
				}
			}
		}
		if !chat.AddGenerationPrompt || chat.ContinueFinalMessage || chat.Unread != nil {
			t.Fatalf("bad flags: %s, unread %v", chatDump(chat), chat.Unread)
		}
		if _, err := (tokenize.ChatML{}).Render(chat); err != nil {
			t.Fatalf("ChatML refused an accepted chat: %v", err)
		}
	}
}
