package hf

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFastSplitMatchesTheRegex compares the direct matcher with the regex it replaces
// (regexp2 with the Unicode corrections) on every golden text and on random strings
// dense in the characters the alternatives hinge on.
func TestFastSplitMatchesTheRegex(t *testing.T) {
	var texts []string
	for _, name := range []string{"qwen3", "gptoss", "mistral7b"} {
		_, cases := readGolden(t, name)
		for _, c := range cases {
			texts = append(texts, c.Text)
		}
	}
	rng := rand.New(rand.NewPCG(9, 12))
	alphabet := []string{"a", "Z", "é", "ß", "ſ", "'", "'s", "'RE", "'ll", "'d", "'x", " ", "  ", "\n", "\r\n", "\t", "\u3000",
		"\u00a0", "\u2028", "1", "42", "٣", "½", "!", "?!", "-", "🙂", "\U0001F6D8", "\U00011DE0", "\u0301", "\u088F", "_", "\u200b",
		"\x00", "\x0b", "\x0c", "\x1c", "\x7f", "\u0085", "\r", " \n"}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.IntN(12); n >= 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		texts = append(texts, b.String())
	}
	for _, expr := range []string{splitCL100K1, splitCL100K3} {
		re, err := compileRegex("test", expr)
		require.NoError(t, err)
		require.NotNil(t, re.fast)
		slow := re
		slow.fast = nil
		for _, text := range texts {
			want, err := slow.matches(text, nil)
			require.NoError(t, err)
			got, err := re.matches(text, nil)
			require.NoError(t, err)
			require.Equal(t, want, got, "%q", text)
		}
	}
}

// TestRealFilesUseTheFastSplit: Qwen3 and Llama 3 spell the regexes exactly so.
func TestRealFilesUseTheFastSplit(t *testing.T) {
	for name, digits := range map[string]int{"qwen3": 1, "llama3_1": 3} {
		t.Run(name, func(t *testing.T) {
			tok := loadModel(t, name, Config{})
			seq, ok := tok.preTokenizer.(preSequence)
			require.True(t, ok)
			sp, ok := seq.steps[0].(*split)
			require.True(t, ok)
			re, ok := sp.pattern.(regex)
			require.True(t, ok)
			require.NotNil(t, re.fast)
			require.Equal(t, digits, re.fast.maxDigits)
		})
	}
}
