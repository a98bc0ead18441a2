package openai

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

func TestParseSGLangGenerateReadsWhatRoutingNeeds(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request
	}{
		{name: "text is a completions prompt; max_new_tokens bounds the output",
			body: `{"text":"The capital of France is","sampling_params":{"max_new_tokens":32,"temperature":0},"stream":true}`,
			want: Request{Prompt: "The capital of France is", MaxTokens: 32, Stream: true}},
		{name: "input_ids are the prompt",
			body: `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":8}}`,
			want: Request{Tokens: []uint32{1, 2, 3}, MaxTokens: 8}},
		{name: "input_ids win over text, as SGLang tokenizes",
			body: `{"text":"ignored","input_ids":[4,5]}`,
			want: Request{Tokens: []uint32{4, 5}}},
		{name: "null input_ids leave the text",
			body: `{"text":"t","input_ids":null}`,
			want: Request{Prompt: "t"}},
		{name: "no max_new_tokens is no bound SGLang checks: _validate_one_request reads the body's, not the default 128",
			body: `{"text":"t"}`,
			want: Request{Prompt: "t"}},
		{name: "nor are sampling_params without one",
			body: `{"text":"t","sampling_params":{"temperature":0}}`,
			want: Request{Prompt: "t"}},
		{name: "null sampling_params are SGLang's {}",
			body: `{"text":"t","sampling_params":null}`,
			want: Request{Prompt: "t"}},
		{name: "a null max_new_tokens is no bound but the context",
			body: `{"text":"t","sampling_params":{"max_new_tokens":null}}`,
			want: Request{Prompt: "t"}},
		{name: "a batch of texts routes by its first, with the first sampling_params",
			body: `{"text":["first","second"],"sampling_params":[{"max_new_tokens":4},{"max_new_tokens":9}]}`,
			want: Request{Prompt: "first", MaxTokens: 4, Sequences: 2}},
		{name: "a batch of id lists routes by its first",
			body: `{"input_ids":[[7,8],[9]],"sampling_params":{"max_new_tokens":2}}`,
			want: Request{Tokens: []uint32{7, 8}, MaxTokens: 2, Sequences: 2}},
		{name: "cache_salt and extra_key make the namespace; lora_path the adapter",
			body: `{"text":"t","cache_salt":"s","extra_key":"k","lora_path":"adapter-a"}`,
			want: Request{Prompt: "t", CacheSalt: "s\x1fextra_key=k", LoRA: "adapter-a"}},
		{name: "a batch's lists give their first",
			body: `{"text":["a","b"],"cache_salt":["s1","s2"],"lora_path":["l1",null]}`,
			want: Request{Prompt: "a", CacheSalt: "s1", LoRA: "l1", Sequences: 2}},
		{name: "a model member is ignored, as SGLang ignores it",
			body: `{"model":"whatever","text":"t","rid":"r1","bootstrap_room":5,"return_logprob":true}`,
			want: Request{Prompt: "t"}},
		{name: "multimodal lists without an item are none, as SGLang's has_valid_data reads them",
			body: `{"text":"t","image_data":[],"video_data":[null],"audio_data":[[],[null]]}`,
			want: Request{Prompt: "t"}},
		{name: "input_embeds beside a prompt are dropped, as _determine_batch_size drops them",
			body: `{"input_ids":[1,2],"input_embeds":[[0.5]]}`,
			want: Request{Tokens: []uint32{1, 2}}},
		{name: "null multimodal fields are none",
			body: `{"text":"t","image_data":null,"input_embeds":null}`,
			want: Request{Prompt: "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(SGLangGenerate, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			require.NoError(t, got.Unsupported)
			assert.Equal(t, tt.want, got)
			session, key, err := ParseSGLangSessions(SGLangGenerate, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Empty(t, session)
			assert.Empty(t, key)
		})
	}
}

// TestParseSGLangGenerateLeavesTheEngineToJudge: a body whose prompt kvroute does not
// compute, or whose fields it does not read as SGLang does, is routed by load
// (Unsupported), not refused: SGLang is the judge of its own API.
func TestParseSGLangGenerateLeavesTheEngineToJudge(t *testing.T) {
	for _, tt := range []struct{ name, body string }{
		{"no prompt", `{"sampling_params":{}}`},
		{"input_embeds are the prompt", `{"input_embeds":[[0.1,0.2]]}`},
		{"image data is part of it", `{"text":"t","image_data":"http://x/cat.png"}`},
		{"audio data too", `{"input_ids":[1],"audio_data":["a"]}`},
		{"an item in a batch's nested lists", `{"text":["a"],"image_data":[[null,{"url":"u"}]]}`},
		{"empty input_ids", `{"input_ids":[]}`},
		{"ids that are not ids", `{"input_ids":[-1]}`},
		{"input_ids of another type", `{"input_ids":"1 2"}`},
		{"text of another type", `{"text":7}`},
		{"an empty batch of texts", `{"text":[]}`},
		{"sampling_params of another type", `{"text":"t","sampling_params":"x"}`},
		{"a negative max_new_tokens", `{"text":"t","sampling_params":{"max_new_tokens":-1}}`},
		{"a cache_salt of another type", `{"text":"t","cache_salt":1}`},
		{"a lora_path of another type", `{"text":"t","lora_path":{}}`},
		{"more ids than max_prompt_tokens", `{"input_ids":[1,2,3,4,5]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(SGLangGenerate, []byte(tt.body), Limits{MaxDepth: 8, MaxPromptTokens: 4})
			require.NoError(t, err)
			require.Error(t, got.Unsupported)
			assert.ErrorIs(t, got.Unsupported, tokenize.ErrUnsupported)
			assert.Empty(t, got.Prompt)
			assert.Empty(t, got.Tokens)
		})
	}
	for _, body := range []string{`[1]`, `{"text":`, ``, `{"text":"t"} x`} {
		_, err := Parse(SGLangGenerate, []byte(body), DefaultLimits())
		var fe *FieldError
		assert.True(t, errors.As(err, &fe), "a body that is not a JSON object is the client's 400: %q gave %v", body, err)
	}
}

// FuzzParseSGLangGenerate: an SGLang body is read, routed by load, or (not a JSON
// object) refused as the client's 400; never a panic, and what is read keeps the
// limits.
func FuzzParseSGLangGenerate(f *testing.F) {
	for _, s := range []string{
		`{"text":"t","sampling_params":{"max_new_tokens":8}}`, `{"input_ids":[1,2],"text":"x"}`, `{"input_ids":[[1],[2]]}`,
		`{"text":["a","b"],"sampling_params":[{"max_new_tokens":1}],"cache_salt":["s"],"lora_path":["l",null],"extra_key":"k"}`,
		`{"input_embeds":[[0.5]]}`, `{"text":"t","image_data":"u"}`, `{"input_ids":[]}`, `{"input_ids":[[]]}`, `{}`, `[]`, `{`,
		`{"text":"t","sampling_params":{"max_new_tokens":null}}`, `{"input_ids":[4294967296]}`,
		`{"input_ids":[1],"session_params":{"id":"s","rid":"r","offset":3}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		got, err := Parse(SGLangGenerate, []byte(body), lim)
		// A body routed without being parsed (max_concurrent_body_bytes) is judged and
		// names its sessions as Parse reads them.
		session, key, busyErr := ParseSGLangSessions(SGLangGenerate, []byte(body), lim)
		if (err == nil) != (busyErr == nil) {
			t.Fatalf("ParseSGLangGenerate %v, ParseSGLangSessions %v", err, busyErr)
		}
		if err == nil && (session != got.SGLangSession || key != got.SessionKey) {
			t.Fatalf("ParseSGLangSessions read %q, %q; Parse %q, %q", session, key, got.SGLangSession, got.SessionKey)
		}
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("rejection is not a *FieldError: %v", err)
			}
			return
		}
		switch {
		case got.Model != "" || got.Chat != nil:
			t.Fatalf("an SGLang body names no model and no chat: %+v", got)
		case got.Unsupported != nil && (!errors.Is(got.Unsupported, tokenize.ErrUnsupported) || len(got.Tokens) != 0 || got.Prompt != ""):
			t.Fatalf("a body routed by load carries a prompt or the wrong reason: %+v", got)
		case len(got.Tokens) > lim.MaxPromptTokens:
			t.Fatalf("%d ids over the limit", len(got.Tokens))
		case got.MaxTokens < 0:
			t.Fatalf("a negative output bound %d", got.MaxTokens)
		case got.SGLangSession != "" && got.Unsupported == nil:
			t.Fatalf("a session's turn is routed on its body's prompt: %+v", got)
		case len(got.SGLangSession) > MaxSGLangSessionBytes:
			t.Fatalf("a session id of %d bytes", len(got.SGLangSession))
		}
	})
}
