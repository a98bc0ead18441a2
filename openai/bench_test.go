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

// benchResponsesBody is benchChatBody's conversation as a Responses API body, as an
// agent that resends it each turn sends it: the system prompt as instructions, user
// turns with input_text parts, answers as output messages.
func benchResponsesBody(tb testing.TB) []byte {
	tb.Helper()
	var chat struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(benchChatBody(tb), &chat); err != nil {
		tb.Fatal(err)
	}
	var input []any
	for _, m := range chat.Messages[1:] {
		if m.Role == "user" {
			input = append(input, map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": m.Content}}})
			continue
		}
		input = append(input, map[string]any{"type": "message", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": m.Content, "annotations": []any{}}}})
	}
	body, err := json.Marshal(map[string]any{"model": "Qwen/Qwen3-8B", "instructions": chat.Messages[0].Content, "input": input,
		"store": false, "stream": true, "max_output_tokens": 256})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkResponsesChatTurn12 is ParseResponses then ResponsesChat of the same 12-turn
// conversation as a Responses API body: what the filter does before the router's
// render, against BenchmarkParseChatTurn12's Parse.
func BenchmarkResponsesChatTurn12(b *testing.B) {
	body := benchResponsesBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseResponses(body, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
		if _, err := ResponsesChat(body, DefaultLimits()); err != nil {
			b.Fatal(err)
		}
	}
}
