package openai

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/tokenize"
)

// FuzzParse feeds arbitrary bodies to both endpoints: every rejection is a
// *FieldError (a 400), and every accepted chat renders.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"documents":[{"title":"t","text":"d"}],"chat_template_kwargs":{"enable_thinking":true},"add_generation_prompt":false,"continue_final_message":true}`,
		`{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":[[1],[2]]}`, `{"model":"m","prompt":["a","b"]}`,
		`{"model":1}`, `[]`, `{`, `{"model":"m","prompt":[4294967296]}`, `{"model":"m","max_tokens":-1,"prompt":"x"}`,
		`{"model":"m","prompt":[[[[[[1]]]]]]}`,
	} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		endpoint := Completions
		if chat {
			endpoint = ChatCompletions
		}
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		got, err := Parse(endpoint, []byte(body), lim)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("rejection is not a *FieldError: %v", err)
			}
			return
		}
		if got.Model == "" {
			t.Fatal("accepted a body without a model")
		}
		if len(got.Tokens) > lim.MaxPromptTokens {
			t.Fatalf("%d ids over the limit", len(got.Tokens))
		}
		if chat {
			if got.Chat == nil || len(got.Chat.Messages) == 0 {
				t.Fatal("accepted a chat without messages")
			}
			if _, err := (tokenize.ChatML{}).Render(got.Chat); err != nil {
				t.Fatalf("accepted chat does not render: %v", err)
			}
		}
	})
}

// FuzzParseUsage: a usage reader never panics, and what it accepts is in range.
func FuzzParseUsage(f *testing.F) {
	for _, s := range []string{
		`data: {"usage":{"prompt_tokens":3000,"prompt_tokens_details":{"cached_tokens":2944}}}` + "\n\ndata: [DONE]\n\n",
		`{"usage":{"prompt_tokens":-1}}`, `{"usage":{"prompt_tokens":1e300}}`, `"usage":`, `"usage":[[[[`, `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":9}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, tail []byte) {
		u, found, err := ParseUsage(tail)
		if err != nil {
			if !errors.Is(err, ErrBadUsage) || !found {
				t.Fatalf("error %v (found %v)", err, found)
			}
			return
		}
		if u.PromptTokens < 0 || u.PromptTokens > MaxUsageTokens || u.CachedTokens < 0 || u.CachedTokens > u.PromptTokens {
			t.Fatalf("accepted %+v", u)
		}
	})
}
