package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/jsonv"
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
		`{"model":1}`, `[]`, `{`, `{"model":"m","prompt":[4294967296]}`, `{"model":"m","max_tokens":-1,"prompt":"x"}`, `{"model":"m","max_tokens":"-0","max_completion_tokens":-1e400,"prompt":"x"}`,
		`{"model":"m","prompt":[[[[[[1]]]]]]}`,
		`{"model":"m","prompt":[1.0,1e2,true,"3"," +1_0 "]}`, `{"model":"m","prompt":["1",2]}`, `{"model":"m","prompt":[[false,"2",3.0]]}`,
		`{"model":"m","prompt":["a",[1]]}`, `{"model":"m","prompt":[1.5]}`,
		// Tools and content parts, accepted and rejected shapes.
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["a","b"]}},"required":["city"]}}}],"tool_choice":"auto"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[1]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{"type":"function"}}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":null,"documents":[{"text":"d"},"x"]}`,
		`{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"not json"}}]}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":{"id":"a"}}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":["a"]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"input_audio","input_audio":{"data":"","format":"wav"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":["a"]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[]}]}`,
		`{"model":"m","messages":[{"role":"user","content":{"type":"text"}}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"\u00e9\ud83d\ude00"}]}],"chat_template_kwargs":{"tools":[]}}`,
		// Fields that make the prompt one kvroute does not compute, or a 400.
		`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"chat_template":null,"chat_template":"t"}}`,
		`{"model":"m","prompt_embeds":"AAAA"}`, `{"model":"m","prompt":null,"prompt_embeds":[]}`, `{"model":"m","prompt":"x","suffix":"y"}`,
		`{"model":"m","prompt":"x","cache_salt":""}`,
		``, ` `, `null`,
		// JSON Python's json reads and RFC 8259 does not.
		"\xef\xbb\xbf" + `{"model":"m","prompt":"x"}`, `{"model":"m","prompt":"x","temperature":NaN}`,
		`{"model":"m","messages":[{"role":"user","content":"x","n":[Infinity,-Infinity]}]}`, `{"model":"m","prompt":[NaN]}`,
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
		// ParseModel (a body routed by load alone) reads the model Parse reads, and
		// refuses, as a *FieldError, whatever Parse refuses for its syntax or its model.
		model, modelErr := ParseModel([]byte(body), lim)
		var mfe *FieldError
		switch {
		case modelErr != nil && (!errors.As(modelErr, &mfe) || !errors.Is(modelErr, ErrBadRequest)):
			t.Fatalf("ParseModel's rejection is not a *FieldError: %v", modelErr)
		case err == nil && (modelErr != nil || model != got.Model):
			t.Fatalf("Parse read model %q, ParseModel %q, %v", got.Model, model, modelErr)
		}
		if strings.TrimSpace(body) == "" && err == nil {
			t.Fatalf("accepted an empty body %q", body)
		}
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
		if got.Unsupported != nil && (chat || !errors.Is(got.Unsupported, tokenize.ErrUnsupported)) {
			t.Fatalf("a prompt kvroute does not compute is not marked so: %v", got.Unsupported)
		}
		if got.MaxTokens < 0 {
			t.Fatalf("accepted a negative output bound %d", got.MaxTokens)
		}
		if chat {
			if got.Chat == nil || len(got.Chat.Messages) == 0 {
				t.Fatal("accepted a chat without messages")
			}
			// A chat the renderers are told not to render (Unread) is routed by load.
			if _, err := (tokenize.ChatML{}).Render(got.Chat); err != nil && (got.Chat.Unread == nil || !errors.Is(err, got.Chat.Unread)) {
				t.Fatalf("accepted chat does not render: %v", err)
			}
			checkChat(t, got.Chat)
		}
	})
}

// checkChat asserts the shape the renderers are promised (tokenize.Chat's doc) and that
// every value handed to a template re-encodes as JSON encoding/json accepts, or, when it
// holds NaN, Infinity or -Infinity (which Python's json reads, and so Parse), as JSON
// with those words.
func checkChat(t *testing.T, chat *tokenize.Chat) {
	t.Helper()
	reencodes := func(what string, v jsonv.Value) {
		out := v.AppendCompact(nil)
		if json.Valid(out) {
			return
		}
		d := jsonv.NewDecoder(out, 1<<10)
		d.AcceptNonFinite()
		if _, err := d.Value(); err != nil || d.End() != nil {
			t.Fatalf("%s re-encodes as invalid JSON: %s", what, out)
		}
	}
	for i, m := range chat.Messages {
		reencodes("message", m)
		if m.Kind() != jsonv.Object {
			t.Fatalf("messages[%d] is not an object", i)
		}
		if role, _ := m.Get("role"); role.Kind() != jsonv.String || role.Str() == "" {
			t.Fatalf("messages[%d] has no string role", i)
		}
		switch content, _ := m.Get("content"); content.Kind() {
		case jsonv.Null, jsonv.String:
		case jsonv.Array:
			for _, part := range content.Items() {
				if part.Kind() == jsonv.String {
					continue
				}
				if part.Kind() != jsonv.Object {
					t.Fatalf("messages[%d] has a content part that is neither an object nor a string", i)
				}
				if typ, _ := part.Get("type"); typ.Str() == "text" {
					if text, _ := part.Get("text"); text.Kind() != jsonv.String {
						t.Fatalf("messages[%d] has a text part without string text", i)
					}
				}
			}
		default:
			t.Fatalf("messages[%d].content is a %v", i, content.Kind())
		}
		if calls, _ := m.Get("tool_calls"); !calls.IsNull() {
			if calls.Kind() != jsonv.Array {
				t.Fatalf("messages[%d].tool_calls is not an array", i)
			}
			for _, c := range calls.Items() {
				if c.Kind() != jsonv.Object {
					t.Fatalf("messages[%d] has a tool call that is not an object", i)
				}
			}
		}
		_ = tokenize.ContentText(m)
	}
	for _, list := range [][]jsonv.Value{chat.Tools, chat.Documents} {
		for _, v := range list {
			reencodes("tool or document", v)
			if v.Kind() != jsonv.Object {
				t.Fatalf("a tool or document is not an object: %s", v.AppendCompact(nil))
			}
		}
	}
	if k := chat.TemplateKwargs.Kind(); k != jsonv.Null && k != jsonv.Object {
		t.Fatalf("chat_template_kwargs is a %v", k)
	}
	if chat.AddGenerationPrompt && chat.ContinueFinalMessage {
		t.Fatal("accepted add_generation_prompt with continue_final_message")
	}
}

// FuzzParseUsage: a usage reader never panics, and what it accepts is in range.
func FuzzParseUsage(f *testing.F) {
	for _, s := range []string{
		`data: {"usage":{"prompt_tokens":3000,"prompt_tokens_details":{"cached_tokens":2944}}}` + "\n\ndata: [DONE]\n\n",
		`{"usage":{"prompt_tokens":-1}}`, `{"usage":{"prompt_tokens":1e300}}`, `"usage":`, `"usage":[[[[`, `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":9}}}`,
		`{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":3}}`,
		`{"usage":{"input_tokens":6,"output_tokens":3,"cache_read_input_tokens":4,"cache_creation_input_tokens":null}}`,
		`{"usage":{"input_tokens":2147483648,"cache_read_input_tokens":2147483648,"cache_creation_input_tokens":1}}`,
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
