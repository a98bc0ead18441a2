package openai

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

func TestParseGenerateReadsWhatRoutingNeeds(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		want      Request
		unsupport bool // Unsupported is set
	}{
		{name: "the token ids are the prompt, the model and salt as given",
			body: `{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":8,"temperature":0},"cache_salt":"s","stream":true}`,
			want: Request{Model: "m", Tokens: []uint32{1, 2, 3}, CacheSalt: "s", Stream: true}},
		{name: "no model is the engine's served model",
			body: `{"token_ids":[7],"sampling_params":{}}`,
			want: Request{Tokens: []uint32{7}}},
		{name: "a null model is no model",
			body: `{"model":null,"token_ids":[7],"sampling_params":{}}`,
			want: Request{Tokens: []uint32{7}}},
		{name: "no max_tokens is no bound (the engine fits it to the context), not the completions 16",
			body: `{"model":"m","token_ids":[7],"sampling_params":{"n":2}}`,
			want: Request{Model: "m", Tokens: []uint32{7}, Sequences: 2}},
		{name: "a null max_tokens is no bound",
			body: `{"model":"m","token_ids":[7],"sampling_params":{"max_tokens":null}}`,
			want: Request{Model: "m", Tokens: []uint32{7}}},
		{name: "an empty cache_salt is no salt, as the engine hashes it",
			body: `{"model":"m","token_ids":[7],"sampling_params":{},"cache_salt":""}`,
			want: Request{Model: "m", Tokens: []uint32{7}}},
		{name: "ids are read as pydantic's lax int reads them",
			body: `{"model":"m","token_ids":[1.0,"2",true],"sampling_params":{"max_tokens":"4"}}`,
			want: Request{Model: "m", Tokens: []uint32{1, 2, 1}}},
		{name: "a field given twice counts the last time",
			body: `{"model":"a","token_ids":"x","sampling_params":1,"model":"m","token_ids":[5],"sampling_params":{"max_tokens":1,"max_tokens":3}}`,
			want: Request{Model: "m", Tokens: []uint32{5}}},
		{name: "fields routing does not read are skipped",
			body: `{"model":"m","request_id":"r","priority":1,"kv_transfer_params":{"do_remote_decode":true},"stream_options":{"include_usage":true},"token_ids":[5],"sampling_params":{"logit_bias":{"1":2}}}`,
			want: Request{Model: "m", Tokens: []uint32{5}}},
		{name: "multimodal features make the prompt one kvroute does not compute",
			body:      `{"model":"m","token_ids":[5],"sampling_params":{},"features":{"mm_hashes":{"image":["h"]}}}`,
			want:      Request{Model: "m", Tokens: []uint32{5}},
			unsupport: true},
		{name: "null features are none",
			body: `{"model":"m","token_ids":[5],"sampling_params":{},"features":null}`,
			want: Request{Model: "m", Tokens: []uint32{5}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(Generate, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.unsupport, got.Unsupported != nil)
			if tt.unsupport {
				assert.ErrorIs(t, got.Unsupported, tokenize.ErrUnsupported)
			}
			got.Unsupported = nil
			assert.Equal(t, tt.want, got)

			model, err := ParseGenerateModel([]byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.want.Model, model, "the load-only read agrees on the model")
		})
	}
}

func TestParseGenerateRefusesWhatVLLMRefuses(t *testing.T) {
	lim := Limits{MaxDepth: 8, MaxPromptTokens: 4}
	tests := []struct {
		name, body, param string
	}{
		{"no token_ids", `{"model":"m","sampling_params":{}}`, "token_ids"},
		{"token_ids not an array", `{"model":"m","token_ids":"1 2","sampling_params":{}}`, "token_ids"},
		{"empty token_ids", `{"model":"m","token_ids":[],"sampling_params":{}}`, "token_ids"},
		{"nested token_ids", `{"model":"m","token_ids":[[1]],"sampling_params":{}}`, "token_ids"},
		{"negative id", `{"model":"m","token_ids":[-1],"sampling_params":{}}`, "token_ids"},
		{"more ids than max_prompt_tokens", `{"model":"m","token_ids":[1,2,3,4,5],"sampling_params":{}}`, "token_ids"},
		{"no sampling_params", `{"model":"m","token_ids":[1]}`, "sampling_params"},
		{"null sampling_params", `{"model":"m","token_ids":[1],"sampling_params":null}`, "sampling_params"},
		{"sampling_params not an object", `{"model":"m","token_ids":[1],"sampling_params":[]}`, "sampling_params"},
		{"negative max_tokens", `{"model":"m","token_ids":[1],"sampling_params":{"max_tokens":-1}}`, "sampling_params.max_tokens"},
		{"fractional max_tokens", `{"model":"m","token_ids":[1],"sampling_params":{"max_tokens":1.5}}`, "sampling_params.max_tokens"},
		{"model not a string", `{"model":1,"token_ids":[1],"sampling_params":{}}`, "model"},
		{"cache_salt not a string", `{"model":"m","token_ids":[1],"sampling_params":{},"cache_salt":1}`, "cache_salt"},
		{"stream not a boolean", `{"model":"m","token_ids":[1],"sampling_params":{},"stream":"maybe"}`, "stream"},
		{"not an object", `[1]`, ""},
		{"not JSON", `{"token_ids":[1],`, ""},
		{"too deep", `{"token_ids":[1],"sampling_params":{"a":[[[[[[[[1]]]]]]]]}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(Generate, []byte(tt.body), lim)
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "a client's 400, got %v", err)
			assert.ErrorIs(t, err, ErrBadRequest)
			assert.Equal(t, tt.param, fe.Param)
		})
	}
}

// FuzzParseGenerate: a generate body is read or refused as the client's 400, never a
// panic; what is read keeps the limits, and the load-only read of its model agrees.
func FuzzParseGenerate(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","token_ids":[1,2,3],"sampling_params":{"max_tokens":8}}`,
		`{"token_ids":[1],"sampling_params":{}}`, `{"model":null,"token_ids":[1.0,"2",true],"sampling_params":{"max_tokens":"4"}}`,
		`{"token_ids":[[1]],"sampling_params":{}}`, `{"token_ids":[],"sampling_params":{}}`, `{"token_ids":[1]}`,
		`{"token_ids":[1],"sampling_params":null}`, `{"token_ids":[1],"sampling_params":{"max_tokens":-1}}`,
		`{"token_ids":[1],"sampling_params":{},"features":{"mm_hashes":{}}}`, `{"token_ids":[4294967296],"sampling_params":{}}`,
		`{"token_ids":[1],"sampling_params":{},"cache_salt":""}`, `{"model":1}`, `[]`, `{`, ``,
		"\xef\xbb\xbf" + `{"token_ids":[1],"sampling_params":{"temperature":NaN}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		got, err := Parse(Generate, []byte(body), lim)
		model, modelErr := ParseGenerateModel([]byte(body), lim)
		for _, e := range []error{err, modelErr} {
			var fe *FieldError
			if e != nil && (!errors.As(e, &fe) || !errors.Is(e, ErrBadRequest)) {
				t.Fatalf("rejection is not a *FieldError: %v", e)
			}
		}
		if err != nil {
			return
		}
		switch {
		case modelErr != nil || model != got.Model:
			t.Fatalf("ParseGenerate read model %q, ParseGenerateModel %q, %v", got.Model, model, modelErr)
		case len(got.Tokens) == 0 || len(got.Tokens) > lim.MaxPromptTokens:
			t.Fatalf("accepted %d ids (limit %d)", len(got.Tokens), lim.MaxPromptTokens)
		case got.MaxTokens != 0:
			t.Fatalf("returned an output bound %d: vLLM's generate checks none against the context", got.MaxTokens)
		case got.Chat != nil || got.Prompt != "":
			t.Fatal("a generate prompt is its token ids alone")
		case got.Unsupported != nil && !errors.Is(got.Unsupported, tokenize.ErrUnsupported):
			t.Fatalf("a prompt kvroute does not compute is not marked so: %v", got.Unsupported)
		}
	})
}

// BenchmarkParseGenerate is openai.Parse of a generate body of 4,096 token ids (an RL
// episode's later turn), beside a completions prompt of the same ids: the decision's
// parse stage for the token-in API.
func BenchmarkParseGenerate(b *testing.B) {
	ids := make([]string, 4096)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i*37%150000)
	}
	list := "[" + strings.Join(ids, ",") + "]"
	for _, bb := range []struct {
		name     string
		endpoint Endpoint
		body     string
	}{
		{"generate", Generate, `{"model":"Qwen/Qwen3-8B","token_ids":` + list + `,"sampling_params":{"max_tokens":256,"temperature":1.0,"top_p":1.0},"stream":true}`},
		{"completions", Completions, `{"model":"Qwen/Qwen3-8B","prompt":` + list + `,"max_tokens":256,"temperature":1.0,"top_p":1.0,"stream":true}`},
	} {
		b.Run(bb.name, func(b *testing.B) {
			body := []byte(bb.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(bb.endpoint, body, DefaultLimits()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSequencesCountWhatTheEngineRuns: a request's parallel samples (n) and its
// batch's prompts are each an engine request (vLLM fans n out, SGLang normalizes a
// batch into its items), so they are counted; a value the engine refuses counts one,
// and no body counts more than MaxSequences.
func TestSequencesCountWhatTheEngineRuns(t *testing.T) {
	tests := []struct {
		name     string
		endpoint Endpoint
		body     string
		want     int
	}{
		{"one chat", ChatCompletions, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 0},
		{"a chat's n", ChatCompletions, `{"model":"m","n":8,"messages":[{"role":"user","content":"x"}]}`, 8},
		{"n read as pydantic reads it", ChatCompletions, `{"model":"m","n":"4","messages":[{"role":"user","content":"x"}]}`, 4},
		{"n the engine refuses counts one", ChatCompletions, `{"model":"m","n":0,"messages":[{"role":"user","content":"x"}]}`, 0},
		{"a hostile n counts MaxSequences", ChatCompletions, `{"model":"m","n":1e18,"messages":[{"role":"user","content":"x"}]}`, MaxSequences},
		{"a completions batch of texts", Completions, `{"model":"m","prompt":["a","b","c"]}`, 3},
		{"a completions batch of id lists, n each", Completions, `{"model":"m","n":2,"prompt":[[1],[2]]}`, 4},
		{"one prompt of ids is one", Completions, `{"model":"m","prompt":[1,2,3]}`, 0},
		{"generate's n", Generate, `{"model":"m","token_ids":[1],"sampling_params":{"n":16}}`, 16},
		{"an SGLang batch of texts, n each", SGLangGenerate, `{"text":["a","b"],"sampling_params":{"n":3}}`, 6},
		{"an SGLang batch of id lists", SGLangGenerate, `{"input_ids":[[1],[2],[3]]}`, 3},
		{"an SGLang batch's first sampling_params give n", SGLangGenerate, `{"text":"a","sampling_params":[{"n":5},{"n":1}]}`, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.endpoint, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Sequences)
		})
	}
}
