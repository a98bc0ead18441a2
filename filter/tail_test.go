package filter

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/openai"
)

// sseChunk is one streamed chat chunk of about 200 bytes, as vLLM sends them.
func sseChunk(i int) []byte {
	return fmt.Appendf(nil, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" w%05d"},"finish_reason":null}]}`+"\n\n", i)
}

const usageChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":2000,"prompt_tokens_details":{"cached_tokens":2944}}}` + "\n\ndata: [DONE]\n\n"

func TestUsageIsReadFromTheTailOfALongStream(t *testing.T) {
	st := &stream{}
	var whole bytes.Buffer
	for i := range 2000 {
		c := sseChunk(i)
		whole.Write(c)
		st.keepTail(c)
		assert.LessOrEqual(t, len(st.usageTail), 2*usageTailBytes, "the kept tail is bounded")
	}
	st.keepTail([]byte(usageChunk))
	whole.WriteString(usageChunk)
	assert.Equal(t, whole.Bytes()[whole.Len()-len(st.tail()):], st.tail(), "the tail is the stream's last bytes")
	u, found, err := openai.ParseUsage(st.tail())
	assert.NoError(t, err)
	assert.True(t, found)
	assert.Equal(t, openai.Usage{PromptTokens: 3000, CachedTokens: 2944}, u)
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
