package tokenize

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
)

func encode(t *testing.T, s string) []uint32 {
	t.Helper()
	ids, err := Approx{}.Encode(s, false)
	require.NoError(t, err)
	return ids
}

func TestApproxIsDeterministicAndPrefixStable(t *testing.T) {
	base := "The quick brown fox jumps over the lazy dog."
	longer := base + " And then it sleeps."
	a, b := encode(t, base), encode(t, longer)
	assert.Equal(t, a, encode(t, base))
	assert.Equal(t, a, b[:len(a)], "a text that extends another at a piece boundary extends its ids")
}

func TestApproxPieces(t *testing.T) {
	tests := []struct {
		name string
		text string
		want int
	}{
		{"empty", "", 0},
		{"words with leading spaces", "hello big world", 5}, // hell|o| big| wor|ld
		{"punctuation is one piece each", "a,b.", 4},
		{"long run is cut every four bytes", "abcdefghij", 3},
		{"multi-byte runes are not split", "ééé", 2}, // 6 bytes: éé|é
		{"newlines and spaces", "a\n\n b", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Len(t, encode(t, tt.text), tt.want)
		})
	}
}

func TestApproxIDsStayInVocabulary(t *testing.T) {
	for _, id := range encode(t, strings.Repeat("mixed TEXT 123 ✓ émoji 🙂 \x00\xff ", 50)) {
		assert.Less(t, id, uint32(ApproxVocabSize))
	}
}

func TestApproxTokenCountNearRealTokenizers(t *testing.T) {
	// English prose averages about four characters per token in BPE vocabularies.
	text := strings.Repeat("Routing requests to the worker that already holds their prefix saves prefill. ", 40)
	ratio := float64(len(text)) / float64(len(encode(t, text)))
	assert.InDelta(t, 4.0, ratio, 1.5)
}

func FuzzApprox(f *testing.F) {
	for _, s := range []string{"", " ", "hello world", "é\xff", "a  b", "\n\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := Approx{}.Encode(s, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > len(s) {
			t.Fatalf("%d ids for %d bytes", len(ids), len(s))
		}
		if utf8.ValidString(s) && len(s) > 0 && len(ids) == 0 {
			t.Fatal("non-empty text gave no ids")
		}
	})
}

// chat builds a Chat from a JSON array of messages.
func chat(t *testing.T, messages string) *Chat {
	t.Helper()
	v, err := jsonv.Parse([]byte(messages), 16)
	require.NoError(t, err)
	return &Chat{Messages: v.Items(), AddGenerationPrompt: true}
}

func TestChatML(t *testing.T) {
	tests := []struct {
		name     string
		messages string
		cont     bool
		noGen    bool
		want     string
	}{
		{"messages then the generation prompt", `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`, false, false,
			"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
		{"text parts joined with a newline, other parts dropped", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]`, false, false,
			"<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"},
		{"tool calls follow the content", `[{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}]`, false, true,
			"<|im_start|>assistant\n[{\"id\":\"1\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]<|im_end|>\n"},
		{"continue_final_message leaves the last message open", `[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}]`, true, false,
			"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := chat(t, tt.messages)
			c.ContinueFinalMessage, c.AddGenerationPrompt = tt.cont, !tt.noGen
			got, err := ChatML{}.Render(c)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	_, err := ChatML{}.Render(&Chat{})
	assert.ErrorIs(t, err, ErrNoMessages)
}

func TestChatMLContinuationSharesThePrefix(t *testing.T) {
	a, _ := ChatML{}.Render(chat(t, `[{"role":"user","content":"Hi"}]`))
	b, _ := ChatML{}.Render(chat(t, `[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":"More"}]`))
	prefix := strings.TrimSuffix(a, "<|im_start|>assistant\n")
	assert.True(t, strings.HasPrefix(b, prefix))
}

func TestChatMLSizeIsExactForStringContents(t *testing.T) {
	tests := []struct {
		name string
		chat *Chat
	}{
		{"one message", TextChat("user", "hi")},
		{"a conversation", TextChat("system", "be brief", "user", "what is a KV cache?", "assistant", "a cache", "user", "why?")},
		{"no generation prompt", &Chat{Messages: TextChat("user", "hi").Messages}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, err := ChatML{}.Render(tt.chat)
			require.NoError(t, err)
			extra := 0
			if !tt.chat.AddGenerationPrompt {
				extra = len("<|im_start|>assistant\n") // counted, not written
			}
			assert.Equal(t, len(text)+extra, chatMLSize(tt.chat))
		})
	}
}
