package openai

import (
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

func TestSetModelReplacesTheModelAlone(t *testing.T) {
	lim := DefaultLimits()
	tests := []struct {
		name, body, model, want string
	}{
		{"first", `{"model":"a","prompt":"x"}`, "b", `{"model":"b","prompt":"x"}`},
		{"last, with spaces kept", "{ \"prompt\" : \"x\" ,\n  \"model\" :  \"a\"  }", "b/c-1", "{ \"prompt\" : \"x\" ,\n  \"model\" :  \"b/c-1\"  }"},
		{"escaped key and value", `{"mod\u0065l":"\u0061","prompt":"x"}`, "b", `{"mod\u0065l":"b","prompt":"x"}`},
		{"a model inside a message stays", `{"messages":[{"role":"user","content":"x","model":"a"}],"model":"a"}`, "b", `{"messages":[{"role":"user","content":"x","model":"a"}],"model":"b"}`},
		{"a name JSON escapes", `{"model":"a"}`, "q\"<x>\\é", `{"model":"q\"\u003cx\u003e\\é"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			got, err := SetModel(body, tt.model, lim)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
			assert.Equal(t, tt.body, string(body), "the input is not modified")
			model, err := ParseModel(got, lim)
			require.NoError(t, err)
			assert.Equal(t, tt.model, model)
		})
	}
	for _, bad := range []string{``, `[]`, `{"prompt":"x"}`, `{"model":"a"`, `{"model":"a"} x`, `{"model":1,"model":"a"}`, `{"model":"a","mod\u0065l":"a"}`} {
		_, err := SetModel([]byte(bad), "b", lim)
		assert.ErrorIs(t, err, ErrBadRequest, bad)
	}
}

// FuzzSetModel: whatever the body, SetModel refuses what ParseModel refuses (bar a body
// without a model, which ParseModel also refuses), and a body giving the model more than
// once, with a *FieldError, and otherwise
// yields a body whose model is the new one and which parses as the old one did in
// every other field.
func FuzzSetModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":[1,2,3]}`, `{ "prompt" : "x", "model" : "m" }`,
		`{"model":"a","model":"b","prompt":"x"}`, `{"mod\u0065l":"m","prompt":"x"}`,
		`{"model":1}`, `[]`, `{`, ``, `{"prompt":"x"}`, `{"model":"m","stream":true,"prompt":"\u00e9"}`,
	} {
		f.Add(s, "target", true)
		f.Add(s, "t/\"<é>\\", false)
	}
	f.Fuzz(func(t *testing.T, body, model string, chat bool) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		endpoint := Completions
		if chat {
			endpoint = ChatCompletions
		}
		out, err := SetModel([]byte(body), model, lim)
		_, modelErr := ParseModel([]byte(body), lim)
		var fe *FieldError
		if err != nil {
			if !errors.As(err, &fe) {
				t.Fatalf("SetModel's rejection is not a *FieldError: %v", err)
			}
			if modelErr == nil && fe.Msg != "'model' is given more than once" {
				t.Fatalf("SetModel refused a body ParseModel reads: %v", err)
			}
			return
		}
		before, beforeErr := Parse(endpoint, []byte(body), lim)
		if beforeErr != nil {
			return // a valid object whose fields Parse refuses: nothing more to compare
		}
		after, afterErr := Parse(endpoint, out, lim)
		if model == "" || !utf8.ValidString(model) {
			return // an empty model is refused; invalid UTF-8 is replaced when encoded
		}
		if afterErr != nil {
			t.Fatalf("the rewritten body does not parse: %v\n%s", afterErr, out)
		}
		if after.Model != model {
			t.Fatalf("model %q, want %q", after.Model, model)
		}
		after.Model = before.Model
		if before.Chat != nil && after.Chat != nil {
			if (before.Chat.Unread == nil) != (after.Chat.Unread == nil) {
				return // the body's new length moved the value budget (valueBytesPerBodyByte) past the chat
			}
			// A chat's values point into their body: compare what they render.
			was, errWas := (tokenize.ChatML{}).Render(before.Chat)
			is, errIs := (tokenize.ChatML{}).Render(after.Chat)
			if was != is || (errWas == nil) != (errIs == nil) {
				t.Fatalf("rewriting the model changed the chat:\n%q\n%q", was, is)
			}
			before.Chat, after.Chat = nil, nil
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("rewriting the model changed another field:\n%+v\n%+v", before, after)
		}
	})
}
