package hf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkGolden encodes every case twice (the second pass is served by the memo where
// pieces are long enough) and reports each case whose ids differ from the library's.
func checkGolden(t *testing.T, tok *Tokenizer, cases []goldenCase) {
	t.Helper()
	mismatches := 0
	for pass := 0; pass < 2; pass++ {
		for _, c := range cases {
			got, err := tok.Encode(c.Text, false)
			require.NoError(t, err, c.Name)
			ok := assert.Equal(t, c.IDs, got, "pass %d, case %q: %q", pass, c.Name, c.Text)
			if c.IDsSpecial != nil {
				got, err := tok.Encode(c.Text, true)
				require.NoError(t, err, c.Name)
				ok = assert.Equal(t, c.IDsSpecial, got, "pass %d, case %q with special tokens: %q", pass, c.Name, c.Text) && ok
			}
			if !ok {
				mismatches++
			}
			if mismatches > 20 {
				t.Fatalf("stopping after %d mismatching cases", mismatches)
			}
		}
	}
	t.Logf("%d cases × 2 passes, %d mismatches; memo %+v", len(cases), mismatches, tok.Stats())
}

// TestGoldenRealTokenizers compares the ids of real tokenizer files with those of
// Hugging Face's tokenizers library (testdata/gen), over curated cases (unicode, emoji,
// whitespace runs, code, numbers, special-token text, a 16 kB document) and a seeded
// random corpus of 2,000 strings per tokenizer.
func TestGoldenRealTokenizers(t *testing.T) {
	for _, name := range []string{"qwen3", "mistral7b", "gptoss", "deepseek_v3", "llama3_1", "gemma3"} {
		t.Run(name, func(t *testing.T) {
			header, cases := readGolden(t, name)
			data := modelFile(t, name)
			require.Equal(t, header.SHA256, sha256Hex(data), "the golden ids of %s were made from %s (sha256 %s), not this file", name, header.Source, header.SHA256)
			tok := loadModel(t, name, DefaultConfig())
			assert.GreaterOrEqual(t, len(cases), 2000)
			checkGolden(t, tok, cases)
		})
	}
}

// TestGoldenVariants covers the components the real files do not use, on variants of
// the committed files built the same way as the generator built them.
func TestGoldenVariants(t *testing.T) {
	for _, v := range readVariants(t) {
		t.Run(v.Name, func(t *testing.T) {
			header, cases := readGolden(t, "variant-"+v.Name)
			require.Equal(t, v.Base, header.Base)
			checkGolden(t, loadVariant(t, v, DefaultConfig()), cases)
		})
	}
}

// TestGoldenWithoutMemo checks that the memo changes no id: the same cases with the
// memo disabled.
func TestGoldenWithoutMemo(t *testing.T) {
	_, cases := readGolden(t, "qwen3")
	tok := loadModel(t, "qwen3", Config{MemoBytes: 0})
	assert.Nil(t, tok.memo)
	checkGolden(t, tok, cases)
	assert.Equal(t, Stats{}, tok.Stats())
}
