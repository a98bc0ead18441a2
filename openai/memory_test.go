package openai

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// tinyValues repeats element, comma-separated, to about size bytes.
func tinyValues(size int, element string) string {
	n := max(1, size/(len(element)+1))
	return strings.Repeat(element+",", n-1) + element
}

// parseMemory parses body and returns the bytes Parse allocated and those still live
// while its result is.
func parseMemory(t *testing.T, body []byte) (req Request, allocated, live uint64) {
	t.Helper()
	var before, parsed, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req, err := Parse(ChatCompletions, body, DefaultLimits())
	runtime.ReadMemStats(&parsed)
	require.NoError(t, err)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(req)
	return req, parsed.TotalAlloc - before.TotalAlloc, after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
}

// TestParseBoundsTheMemoryOfTinyValues pins what a chat body of tiny JSON values costs
// Parse. A value took 48 bytes, and slices grown by appending allocated five times
// their size: a 4 MiB body of `"x":[0,0,…]` in a message allocated 503 MiB and kept 97
// MiB (125 and 24 times the body). Values are 16 bytes now, materialised into
// allocations of exactly their size, and a chat whose values would take more than 4
// bytes per byte of body (the densest shapes) is not materialised at all: its Chat is
// Unread, and the request is routed by load alone. Just under that density, the
// values are read as before and take at most 4 times the body (plus the 64 KiB
// floor), allocating at most 5 times.
func TestParseBoundsTheMemoryOfTinyValues(t *testing.T) {
	const size = 1 << 20
	chatWith := func(members string) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + members + `}`)
	}
	kwargs := func(size int) string {
		var b strings.Builder
		for i := 0; b.Len() < size; i++ {
			fmt.Fprintf(&b, `"%x":0,`, i)
		}
		return strings.TrimSuffix(b.String(), ",")
	}
	tests := []struct {
		name   string
		body   []byte
		unread bool // over the value budget: not materialised
	}{
		{"zeros in a message's extra key", []byte(`{"model":"m","messages":[{"role":"user","content":"hi","x":[` + tinyValues(size, "0") + `]}]}`), true},
		{"empty arrays in a message's extra key", []byte(`{"model":"m","messages":[{"role":"user","content":"hi","x":[` + tinyValues(size, "[]") + `]}]}`), true},
		{"empty tools", chatWith(`,"tools":[` + tinyValues(size, "{}") + `]`), true},
		{"zeros in a tool's parameters", chatWith(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"x":[` + tinyValues(size, "0") + `]}}}]`), true},
		{"empty string content parts", []byte(`{"model":"m","messages":[{"role":"user","content":[` + tinyValues(size, `""`) + `]}]}`), true},
		{"messages of a one-letter role", []byte(`{"model":"m","messages":[` + tinyValues(size, `{"role":"u"}`) + `]}`), true},
		{"zeros in documents", chatWith(`,"documents":[{"x":[` + tinyValues(size, "0") + `]}]`), true},
		{"two-letter strings in a message's extra key", []byte(`{"model":"m","messages":[{"role":"user","content":"hi","x":[` + tinyValues(size, `"ab"`) + `]}]}`), false},
		{"tools of one short member", chatWith(`,"tools":[` + tinyValues(size, `{"abcd":"ef"}`) + `]`), false},
		{"two-letter content parts", []byte(`{"model":"m","messages":[{"role":"user","content":[` + tinyValues(size, `"ab"`) + `]}]}`), false},
		{"messages of a role alone", []byte(`{"model":"m","messages":[` + tinyValues(size, `{"role":"user"}`) + `]}`), false},
		{"kwargs of many keys", chatWith(`,"chat_template_kwargs":{` + kwargs(size) + `}`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, allocated, live := parseMemory(t, tt.body)
			n := float64(len(tt.body))
			t.Logf("%d-byte body: %.2f bytes allocated and %.2f live per byte of body", len(tt.body), float64(allocated)/n, float64(live)/n)
			require.NotNil(t, req.Chat)
			if tt.unread {
				assert.ErrorIs(t, req.Chat.Unread, errChatUnread)
				assert.Empty(t, req.Chat.Messages)
				assert.Less(t, float64(allocated), 0.5*n, "a chat over the budget is only measured")
				return
			}
			require.NoError(t, req.Chat.Unread)
			require.NotEmpty(t, req.Chat.Messages)
			assert.LessOrEqual(t, float64(live), valueBytesPerBodyByte*n+valueBytesFloor)
			assert.LessOrEqual(t, float64(allocated), 5*n)
		})
	}
}

// TestParseChatOverTheValueBudget pins what a chat over the budget keeps: the flags,
// and the checks of the fields that were read, which give the same errors as without a
// budget; the fields over it are not checked.
func TestParseChatOverTheValueBudget(t *testing.T) {
	zeros := `[` + tinyValues(valueBytesFloor, "0") + `]`
	tests := []struct {
		name   string
		body   string
		unread bool   // the chat is Unread
		err    string // or Parse fails so
	}{
		{"extra message key", `{"model":"m","messages":[{"role":"user","x":` + zeros + `}]}`, true, ""},
		{"flags kept", `{"model":"m","add_generation_prompt":false,"continue_final_message":true,"messages":[{"role":"user","x":` + zeros + `}]}`, true, ""},
		{"a later small duplicate is read", `{"model":"m","messages":[{"role":"user","x":` + zeros + `}],"messages":[{"role":"user","content":"x"}]}`, false, ""},
		{"both flags refused", `{"model":"m","continue_final_message":true,"messages":[{"role":"user","x":` + zeros + `}]}`, false, "cannot both"},
		{"messages read are checked", `{"model":"m","messages":[{"content":"x"}],"tools":[{"x":` + zeros + `}]}`, false, "role is required"},
		{"a scalar field gets its own error", `{"model":` + zeros + `,"messages":[{"role":"user"}]}`, false, "'model' is required"},
		{"max_tokens too", `{"model":"m","max_tokens":` + zeros + `,"messages":[{"role":"user"}]}`, false, "non-negative integer"},
		{"a syntax error past the budget is still found", `{"model":"m","messages":[{"role":"user","x":` + zeros[:len(zeros)-1] + `,]}]}`, false, "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Parse(ChatCompletions, []byte(tt.body), DefaultLimits())
			if tt.err != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrBadRequest)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			if !tt.unread {
				require.NoError(t, req.Chat.Unread)
				assert.Len(t, req.Chat.Messages, 1)
				return
			}
			assert.ErrorIs(t, req.Chat.Unread, errChatUnread)
			assert.Empty(t, req.Chat.Messages)
			assert.Equal(t, !strings.Contains(tt.body, `"add_generation_prompt":false`), req.Chat.AddGenerationPrompt)
			assert.Equal(t, strings.Contains(tt.body, `"continue_final_message":true`), req.Chat.ContinueFinalMessage)
			_, err = tokenize.ChatML{}.Render(req.Chat)
			assert.ErrorIs(t, err, errChatUnread, "renderers refuse it")
		})
	}
}

// TestScalarFieldsAreReadWhateverTheChatLeftOfTheBudget: a valid request is never
// refused for what its chat fields took of the value budget. A tool whose enum holds
// thousands of one-digit integers takes more than 4 bytes per byte of body; read
// within the budget, it can leave less than the model's name, which was then read as
// over the budget and refused with a 400 ("'model' is required"), as was a max_tokens
// of three digits. Across the tools' sizes where the budget runs out, every request
// is read, its chat either whole or Unread.
func TestScalarFieldsAreReadWhateverTheChatLeftOfTheBudget(t *testing.T) {
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	read, unread := 0, 0
	for n := 7200; n < 7400; n++ {
		body := `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f",` +
			`"parameters":{"type":"object","properties":{"x":{"type":"integer","enum":[` + tinyValues(2*n, "7") + `]}}}}}],` +
			`"model":"` + model + `","max_tokens":100,"cache_salt":"s"}`
		req, err := Parse(ChatCompletions, []byte(body), DefaultLimits())
		require.NoError(t, err, "%d enum values", n)
		assert.Equal(t, model, req.Model)
		assert.Equal(t, "s", req.CacheSalt)
		if req.Chat.Unread != nil {
			unread++
		} else {
			read++
		}
	}
	require.NotZero(t, read, "some tools are read")
	require.NotZero(t, unread, "some are over the budget")
}
