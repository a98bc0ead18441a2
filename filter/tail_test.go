package filter

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/openai"
)

// sseChunk is one streamed chat chunk of about 200 bytes, as vLLM sends them.
func sseChunk(i int) []byte {
	return fmt.Appendf(nil, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" w%05d"},"finish_reason":null}]}`+"\n\n", i)
}

const (
	usageEvent = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":2000,"prompt_tokens_details":{"cached_tokens":2944}}}` + "\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

// TestUsageIsReadFromTheTailOfALongStream streams 2,000 chunks, then the end of the
// response cut in different places, and checks the kept tail stays bounded and still
// yields the usage object.
func TestUsageIsReadFromTheTailOfALongStream(t *testing.T) {
	cut := strings.Index(usageEvent, `"usage"`) + 3 // inside the key
	value := strings.Index(usageEvent, `"prompt_tokens_details"`)
	tests := []struct {
		name  string
		end   []string
		found bool
	}{
		{"usage and [DONE] in one chunk", []string{usageEvent + doneEvent}, true},
		{"[DONE] in its own chunk", []string{usageEvent, doneEvent}, true},
		{"the usage key cut across chunks", []string{usageEvent[:cut], usageEvent[cut:], doneEvent}, true},
		{"the usage value cut across chunks", []string{usageEvent[:value], usageEvent[value:] + doneEvent}, true},
		{"no usage", []string{doneEvent}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &stream{}
			for i := range 2000 {
				c := sseChunk(i)
				st.keepTail(c)
				assert.LessOrEqual(t, st.usageTailBytes, usageTailBytes+len(c), "the kept tail is bounded")
			}
			for _, c := range tt.end {
				st.keepTail([]byte(c))
			}
			u, found, err := openai.ParseUsage(st.tail())
			assert.NoError(t, err)
			assert.Equal(t, tt.found, found)
			if tt.found {
				assert.Equal(t, openai.Usage{PromptTokens: 3000, CachedTokens: 2944}, u)
			}
		})
	}
}

func TestAShortResponseKeepsEveryChunk(t *testing.T) {
	st := &stream{}
	st.keepTail([]byte(`{"usage":{"prompt_tokens":7,`))
	st.keepTail(nil)
	st.keepTail([]byte(`"prompt_tokens_details":{"cached_tokens":4}}}`))
	u, found, err := openai.ParseUsage(st.tail())
	assert.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, openai.Usage{PromptTokens: 7, CachedTokens: 4}, u)
	assert.Len(t, st.usageTail[st.usageTailFrom:], 2, "empty chunks are not kept")
}

// BenchmarkKeepTail streams a 2,000-token response (2,000 chunks of ~200 bytes)
// through the tail kept for the usage object.
func BenchmarkKeepTail(b *testing.B) {
	chunks := make([][]byte, 2000)
	for i := range chunks {
		chunks[i] = sseChunk(i)
	}
	for b.Loop() {
		st := &stream{}
		for _, c := range chunks {
			st.keepTail(c)
		}
	}
}
