package hf

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// h74: Qwen3's normalizer is NFC. golang.org/x/text's NFC writes the Stream-Safe Text
// Format: after 30 non-starters in a row it inserts U+034F COMBINING GRAPHEME JOINER,
// which Hugging Face's library (Rust unicode-normalization's nfc(), no stream-safe
// step) and Python's unicodedata never do. Past 30 combining marks the text kvroute
// encodes is not the engine's, so neither are the ids. Want: the ids of npm
// tokenizers@0.23.2 (Tokenizer.fromFile on the embedded Qwen3 tokenizer.json,
// addSpecialTokens false).
func TestH74LongCombiningRunsEncodeAsTheLibrary(t *testing.T) {
	tok := loadModel(t, "qwen3", Config{})
	rep := func(id uint32, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = id
		}
		return out
	}
	pairs := func(n int) []uint32 {
		var out []uint32
		for range n {
			out = append(out, 136, 244)
		}
		return out
	}
	cases := []struct {
		name, text string
		want       []uint32
	}{
		// The library reorders each run (U+0316, class 220, before U+0301, 230); kvroute's
		// ids carry 0x89 0xed, the bytes of the CGJ x/text inserted after 30 marks.
		{"x + 16×(U+0316 U+0301)", "x" + strings.Repeat("\u0316\u0301", 16), append(append([]uint32{87}, pairs(16)...), rep(53839, 16)...)},
		{"a + 20×(U+0316 U+0301)", "a" + strings.Repeat("\u0316\u0301", 20), append(append([]uint32{1953}, pairs(20)...), rep(53839, 19)...)},
		{"e + 40×U+0301", "e" + strings.Repeat("\u0301", 40), append([]uint32{963}, rep(53839, 39)...)},
	}
	for _, c := range cases {
		got, err := tok.Encode(c.text, false)
		if assert.NoError(t, err) {
			assert.Equal(t, c.want, got, c.name)
		}
	}
}
