package tokenize

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func encode(t *testing.T, s string) []uint32 {
	t.Helper()
	ids, err := Approx{}.Encode(s)
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
		ids, err := Approx{}.Encode(s)
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

func TestChatML(t *testing.T) {
	got, err := ChatML{}.Render([]Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}})
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", got)

	_, err = ChatML{}.Render(nil)
	assert.ErrorIs(t, err, ErrNoMessages)
}

func TestChatMLContinuationSharesThePrefix(t *testing.T) {
	turn1 := []Message{{Role: "user", Content: "Hi"}}
	turn2 := append(turn1, Message{Role: "assistant", Content: "Hello!"}, Message{Role: "user", Content: "More"})
	a, _ := ChatML{}.Render(turn1)
	b, _ := ChatML{}.Render(turn2)
	prefix := strings.TrimSuffix(a, "<|im_start|>assistant\n")
	assert.True(t, strings.HasPrefix(b, prefix))
}
