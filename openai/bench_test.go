package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// benchChatBody is a chat body of about 16 KB, shaped like turn 12 of a conversation
// with code in its answers: a system prompt, 11 exchanges and a question, with the
// newlines, tabs, quotes and non-ASCII text that make a JSON string carry escapes.
func benchChatBody(tb testing.TB) []byte {
	tb.Helper()
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []message{{"system", strings.Repeat("You are a careful assistant for platform engineers. ", 30)}}
	for i := 1; i <= 11; i++ {
		msgs = append(msgs,
			message{"user", fmt.Sprintf("Question %d: how do I pick the worker holding the longest prefix of %d blocks?", i, 1024*i)},
			message{"assistant", fmt.Sprintf("Turn %d.\n\n1. Hash the blocks.\n2. Look up \"overlap\".\n\n```go\nfunc pick(ws []Worker) int {\n\tfor i, w := range ws {\n\t\tif w.Cost() < best {\n\t\t\tbest = i\n\t\t}\n\t}\n\treturn best\n}\n```\n\nRésumé: measure — p99 matters. 🚀 ", i) +
				strings.Repeat("Under load the prefill term dominates only while queues are short. ", 12)})
	}
	msgs = append(msgs, message{"user", "Question 12: and under load?"})
	body, err := json.Marshal(map[string]any{"model": "Qwen/Qwen3-8B", "messages": msgs, "max_tokens": 256, "stream": true})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkParseChatTurn12 is openai.Parse of a 12-turn chat body: the decision's
// parse stage.
func BenchmarkParseChatTurn12(b *testing.B) {
	body := benchChatBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(ChatCompletions, body, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}
