package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The tests below hold `extproc tokenize` (openai.Parse, filter.RouteRequest and the
// router's Prompter, the router's own path) to what vLLM does with the request fields
// that change the prompt it serves: a field kvroute cannot reproduce routes the request
// by load rather than on ids the engine never computes, and a field vLLM refuses is
// refused. vLLM's behaviour is read from vllm/entrypoints/openai/chat_completion/protocol.py
// and completion/protocol.py at 002032ee2b18, and vllm/renderers/online_renderer.py at
// 01063cd07bef.

// TestAnEmptyCacheSaltIsRefused: vLLM refuses a cache_salt that is the empty string
// ("Parameter 'cache_salt' must be a non-empty string if provided."; the field's
// min_length=1), on every API it takes one. kvroute read it as no salt and routed the
// request on unsalted blocks.
func TestAnEmptyCacheSaltIsRefused(t *testing.T) {
	for _, tt := range []struct{ body, flag string }{
		{`{"model":"q","messages":[{"role":"user","content":"Hi"}],"cache_salt":""}`, ""},
		{`{"model":"q","prompt":"Hi","cache_salt":""}`, "-completions"},
		{`{"model":"q","input":"Hi","store":false,"cache_salt":""}`, "-responses"},
		{`{"model":"q","max_tokens":8,"messages":[{"role":"user","content":"Hi"}],"cache_salt":""}`, "-messages"},
	} {
		var args []string
		if tt.flag != "" {
			args = append(args, tt.flag)
		}
		_, stderr, code := tokenizeCmd(t, tt.body, args...)
		assert.Equal(t, 1, code, tt.body)
		assert.Contains(t, stderr, "cache_salt", tt.body)
	}
}
