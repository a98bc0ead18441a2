package hf

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// windowVariants are pipelines whose first pre-tokenizer is an isolating Split of a
// kind no committed file or variant starts with: on a literal, Isolated and Removed
// inverted (which keeps only the matches); on a regex that matches the empty string,
// one inverted, and one that looks behind (its matches found all at once).
var windowVariants = []variant{
	{Name: "qwen3-regex-empty-matches", Base: "qwen3", Set: map[string]json.RawMessage{"pre_tokenizer": json.RawMessage(
		`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "x*|(?=\\d)"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]}`)}},
	{Name: "qwen3-regex-inverted", Base: "qwen3", Set: map[string]json.RawMessage{"pre_tokenizer": json.RawMessage(
		`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "[aeiou]+|\\s+(?!\\S)"}, "behavior": "Removed", "invert": true}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]}`)}},
	{Name: "qwen3-regex-looks-behind", Base: "qwen3", Set: map[string]json.RawMessage{"pre_tokenizer": json.RawMessage(
		`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?<=a)b|(?<!c)x"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]}`)}},
	{Name: "qwen3-literal-isolated", Base: "qwen3", Set: map[string]json.RawMessage{"pre_tokenizer": json.RawMessage(
		`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false}, {"type": "Digits", "individual_digits": true}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}`)}},
	{Name: "qwen3-literal-removed-inverted", Base: "qwen3", Set: map[string]json.RawMessage{"pre_tokenizer": json.RawMessage(
		`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": "ab"}, "behavior": "Removed", "invert": true}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]}`)}},
}

// prefixTokenizers are every committed file, every variant of testdata/variants.json
// and windowVariants, memo off.
func prefixTokenizers(t *testing.T) map[string]*Tokenizer {
	t.Helper()
	out := map[string]*Tokenizer{}
	for name := range committedModels {
		out[name] = loadModel(t, name, Config{})
	}
	for _, v := range append(readVariants(t), windowVariants...) {
		out[v.Name] = loadVariant(t, v, Config{})
	}
	return out
}

// prefixTexts are texts of each kind a prefix may be cut in: short chats with added
// tokens (every cut is tried), and pieces of more than one window of pre-tokens.
func prefixTexts() (short, long []string) {
	rng := rand.New(rand.NewPCG(9, 9))
	runes := []rune("ab xyz 0123456789 \n\t.,!?-;é漢字🙂<>|_")
	random := make([]rune, 6000)
	for i := range random {
		random[i] = runes[rng.IntN(len(runes))]
	}
	short = []string{
		"<|im_start|>user\nHello, world! 12345<|im_end|>\n<|im_start|>assistant\n",
		"<s>[INST] x y [/INST] ok</s><s>[INST] <<SYS>> 42 <</SYS>> ab ab abab [/INST]",
		"<|im_start|><|im_end|><|im_start|>  spaces   \n\n\n<|im_end|>",
		"ab-cd;ef, Ghi JKL 12 345 aeiou xx  x",
	}
	long = []string{
		strings.Repeat("The router hashes each prompt's token blocks, 64 tokens each; ", 200),
		strings.Repeat("1234567890", 500),
		strings.Repeat("ab ", 2000) + "<|im_end|>" + strings.Repeat("x ", 1500),
		string(random),
		conversation(6),
	}
	return short, long
}

// TestEncodePrefixIsTheFirstIDs pins the contract of AppendEncodePrefix on every
// pipeline: its ids are exactly the first maxIDs ids of Encode's, after dst, and rest is
// 0 exactly when they are all of them, whether the cut lands in a word, at an added
// token, at a window's edge or past the end.
func TestEncodePrefixIsTheFirstIDs(t *testing.T) {
	short, long := prefixTexts()
	dst := []uint32{7, 7}
	for name, tok := range prefixTokenizers(t) {
		t.Run(name, func(t *testing.T) {
			check := func(text string, special bool, maxIDs int, full []uint32) {
				t.Helper()
				got, rest, err := tok.AppendEncodePrefix(dst[:2:2], text, special, maxIDs)
				require.NoError(t, err)
				want := full[:min(maxIDs, len(full))]
				require.Equal(t, dst, got[:2], "dst is kept")
				require.Equal(t, want, got[2:], "%q, special %v, maxIDs %d", text, special, maxIDs)
				assert.Equal(t, maxIDs < len(full), rest > 0, "%q, special %v, maxIDs %d: rest %d", text, special, maxIDs, rest)
				assert.LessOrEqual(t, rest, len(text))
			}
			for _, special := range []bool{false, true} {
				for _, text := range short {
					full, err := tok.Encode(text, special)
					require.NoError(t, err)
					for maxIDs := 1; maxIDs <= len(full)+1; maxIDs++ {
						check(text, special, maxIDs, full)
					}
				}
				if special {
					continue // the long texts start with no added token to cut at
				}
				for _, text := range long {
					full, err := tok.Encode(text, special)
					require.NoError(t, err)
					n := len(full)
					for _, maxIDs := range []int{1024, 1025, n / 2, n - 1, n} {
						if maxIDs > 0 {
							check(text, special, maxIDs, full)
						}
					}
				}
			}
		})
	}
}

// TestWindowsChangeNoID: cutting a piece's first split in windows (window.go) gives the
// ids of pre-tokenizing it whole, on pieces of many windows, for the direct matcher
// (Qwen3), regexp2 patterns (gpt-oss, and ones matching the empty string), a pattern
// found all at once and literals, with windows of every size down to one part.
func TestWindowsChangeNoID(t *testing.T) {
	short, long := prefixTexts()
	short = append(short, "xx1x 2 xxab ab\n\n a ba b", "1")
	windowed := map[string]int{}
	for name, tok := range prefixTokenizers(t) {
		if tok.windowed == nil {
			continue
		}
		switch {
		case tok.windowed.resume != nil:
			windowed["resumed"]++
		case tok.windowed.regex != nil:
			windowed["regex"]++
		default:
			windowed["all at once"]++
		}
		whole := *tok
		whole.windowed = nil
		t.Run(name, func(t *testing.T) {
			for _, parts := range []int{1, 2, 3, windowParts} {
				ws := *tok.windowed
				ws.parts = parts
				small := *tok
				small.windowed = &ws
				texts := short
				if parts == windowParts {
					texts = long
				}
				for _, text := range texts {
					got, err := small.Encode(text, false)
					require.NoError(t, err)
					want, err := whole.Encode(text, false)
					require.NoError(t, err)
					require.Equal(t, want, got, "windows of %d parts: %.80q…", parts, text)
				}
			}
		})
	}
	assert.Equal(t, map[string]int{"resumed": 6, "regex": 3, "all at once": 1}, windowed,
		"qwen3, its variants of other parts and the literal variants resumed; gptoss and two regex variants in runes; one looks behind")
}

// TestEncodePrefixStopsBeforeLongWords: the long words (256 bytes or more, as the model
// sees them) an encode takes are bounded in sum by MaxLongWordBytes; the encode stops
// before the word that would pass it, however the bytes are cut into words, and says
// how much it left.
func TestEncodePrefixStopsBeforeLongWords(t *testing.T) {
	tok := loadModel(t, "qwen3", Config{})
	// For Qwen3 "\n" ends a run of letters and starts none: each run is one word of its
	// length.
	run := func(n int) string { return strings.Repeat("a", n) }
	half := MaxLongWordBytes / 2
	tests := []struct {
		name string
		text string
		// wantPrefix is the text whose ids the encode returns; "" for all of text's.
		wantPrefix string
	}{
		{"one word at the bound", "x\n" + run(MaxLongWordBytes), ""},
		{"one word past the bound", "x\n" + run(MaxLongWordBytes+1), "x\n"},
		{"two halves fill the bound", run(half) + "\n" + run(half) + "\nshort words after", ""},
		{"a third long word passes it", run(half) + "\n" + run(half) + "\n" + run(256) + "\nmore", run(half) + "\n" + run(half) + "\n"},
		{"short words do not count", strings.Repeat("\n"+run(255), 2*MaxLongWordBytes/255), ""},
		{"in a later piece", run(half) + "<|im_end|>" + run(half+1), run(half) + "<|im_end|>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			full, err := tok.Encode(tt.text, false)
			require.NoError(t, err)
			got, rest, err := tok.AppendEncodePrefix(nil, tt.text, false, 0)
			require.NoError(t, err)
			if tt.wantPrefix == "" {
				assert.Equal(t, full, got)
				assert.Zero(t, rest)
				return
			}
			want, err := tok.Encode(tt.wantPrefix, false)
			require.NoError(t, err)
			assert.Equal(t, want, got)
			assert.Equal(t, full[:len(want)], got, "a prefix of the whole text's ids")
			// rest counts from the start of the window the encode stopped in.
			assert.GreaterOrEqual(t, rest, len(tt.text)-len(tt.wantPrefix))
			assert.LessOrEqual(t, rest, len(tt.text))
		})
	}
}

// TestMemoHoldsNoCutPiece: a piece an encode stopped in is not memoised, and the memo
// changes no stop: the same prefix and rest with a memo that holds every piece, or
// none, as without a memo.
func TestMemoHoldsNoCutPiece(t *testing.T) {
	half := MaxLongWordBytes / 2
	text := "<|im_start|>user\n" + strings.Repeat("a", half) + "<|im_end|>\n" + strings.Repeat("1234 ", 3000) + "<|im_end|>\n" +
		strings.Repeat("b", half+1) + "<|im_end|>"
	plain := loadModel(t, "qwen3", Config{})
	full, err := plain.Encode(text, false)
	require.NoError(t, err)
	for _, maxIDs := range []int{10, 8000, 0} { // in the digits piece, in the long word's, none
		wantIDs, wantRest, err := plain.AppendEncodePrefix(nil, text, false, maxIDs)
		require.NoError(t, err)
		require.NotZero(t, wantRest, "the long words pass the bound")

		cold := loadModel(t, "qwen3", DefaultConfig())
		ids, rest, err := cold.AppendEncodePrefix(nil, text, false, maxIDs)
		require.NoError(t, err)
		assert.Equal(t, wantIDs, ids, "maxIDs %d, memo empty", maxIDs)
		assert.Equal(t, wantRest, rest)
		got, err := cold.Encode(text, false)
		require.NoError(t, err)
		assert.Equal(t, full, got, "maxIDs %d: the memo served a cut piece as whole", maxIDs)

		ids, rest, err = cold.AppendEncodePrefix(nil, text, false, maxIDs)
		require.NoError(t, err)
		assert.Equal(t, wantIDs, ids, "maxIDs %d, memo full", maxIDs)
		assert.Equal(t, wantRest, rest)
	}
}

// TestLooksBehind: a regex that may read text before a match's start is not searched in
// windows; escaped look-alikes are.
func TestLooksBehind(t *testing.T) {
	tests := []struct {
		expr string
		want bool
	}{
		{splitCL100K3, false},
		{`\s+(?!\S)|\p{N}{1,3}`, false},
		{`(?<=a)b`, true},
		{`(?<!a)b`, true},
		{`(?<name>a)`, true},
		{`\Ga`, true},
		{`\Aa`, true},
		{`a\Bb`, true},
		{`\\b|\\G`, false},
		{`\(?<a`, false},
		{`a\`, false},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			assert.Equal(t, tt.want, looksBehind(tt.expr))
		})
	}
}

// TestEncodePrefixTakesTheLargestBoundAfterIDs pins that a bound as large as an int
// (a caller's "no bound" of math.MaxInt) after ids already in dst is no bound: the bound
// is counted from dst's end, and their sum must not wrap into a negative capacity.
// The ids are npm tokenizers@0.23.2's for Qwen3's tokenizer.json.
func TestEncodePrefixTakesTheLargestBoundAfterIDs(t *testing.T) {
	tok, err := LoadBuiltin("qwen3")
	require.NoError(t, err)
	for _, maxIDs := range []int{math.MaxInt, math.MaxInt - 1, 2} {
		ids, rest, err := tok.AppendEncodePrefix([]uint32{7}, "Hello world", false, maxIDs)
		require.NoError(t, err, maxIDs)
		require.Equal(t, []uint32{7, 9707, 1879}, ids, maxIDs)
		require.Zero(t, rest, maxIDs)
	}
}
