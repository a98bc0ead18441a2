package hf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tinyJSON is a minimal valid tokenizer.json: four tokens and one merge.
const tinyJSON = `{
  "version": "1.0",
  "added_tokens": [{"id": 4, "content": "<s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}],
  "normalizer": null,
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}},
  "decoder": null,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, " ": 3}, "merges": ["a b"]}
}`

// withField returns tinyJSON with a top-level field (dotted: inside model) replaced.
func withField(t testing.TB, key, value string) []byte {
	t.Helper()
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(tinyJSON), &top))
	if inner, ok := strings.CutPrefix(key, "model."); ok {
		var model map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(top["model"], &model))
		model[inner] = json.RawMessage(value)
		top["model"], _ = json.Marshal(model)
	} else {
		top[key] = json.RawMessage(value)
	}
	out, err := json.Marshal(top)
	require.NoError(t, err)
	return out
}

func TestTinyTokenizer(t *testing.T) {
	tok, err := Parse([]byte(tinyJSON), DefaultConfig())
	require.NoError(t, err)
	tests := []struct {
		name    string
		text    string
		special bool
		want    []uint32
	}{
		{"merges a b", "abab", false, []uint32{2, 2}},
		{"template adds <s> with special tokens", "ab", true, []uint32{4, 2}},
		{"added token text becomes the token", "a<s>b", false, []uint32{0, 4, 1}},
		{"unknown characters vanish before merging, without unk_token", "axb", false, []uint32{2}},
		{"empty text", "", true, []uint32{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tok.Encode(tt.text, tt.special)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestInvalidUTF8IsReadAsReplacementCharacters(t *testing.T) {
	tok, err := Parse(withField(t, "model.vocab", `{"a": 0, "b": 1, "ab": 2, "\ufffd": 3}`), DefaultConfig())
	require.NoError(t, err)
	got, err := tok.Encode("a\xff\xfeb", false)
	require.NoError(t, err)
	assert.Equal(t, []uint32{0, 3, 3, 1}, got)
}

func TestParseErrorsNameThePath(t *testing.T) {
	tests := []struct {
		name  string
		data  []byte
		error string
	}{
		{"not JSON", []byte("{"), "tokenizer.json: not valid JSON"},
		{"not an object", []byte("[1]"), "tokenizer.json: not a JSON object"},
		{"not UTF-8", []byte("{\"a\": \"\xff\"}"), "not valid UTF-8"},
		{"unknown version", withField(t, "version", `"2.0"`), `tokenizer.json: version "2.0" is not supported`},
		{"truncation", withField(t, "truncation", `{"max_length": 8}`), "tokenizer.json: truncation (must be null"},
		{"padding", withField(t, "padding", `{}`), "tokenizer.json: padding (must be null"},
		{"no model", withField(t, "model", `null`), "tokenizer.json: model: missing"},
		{"model type", withField(t, "model.type", `"WordPiece"`), `tokenizer.json: model.type "WordPiece" is not supported`},
		{"dropout", withField(t, "model.dropout", `0.1`), "tokenizer.json: model.dropout (must be null"},
		{"subword prefix", withField(t, "model.continuing_subword_prefix", `"##"`), `tokenizer.json: model.continuing_subword_prefix "##" is not supported`},
		{"unknown model option", withField(t, "model.fancy", `true`), "tokenizer.json: model.fancy is not supported"},
		{"vocab not an object", withField(t, "model.vocab", `[]`), "tokenizer.json: model.vocab: want an object"},
		{"negative id", withField(t, "model.vocab", `{"a": -1}`), "tokenizer.json: model.vocab: want an object"},
		{"merge of three", withField(t, "model.merges", `["a b c"]`), "tokenizer.json: model.merges[0]: want two tokens"},
		{"merge outside vocab", withField(t, "model.merges", `["a c"]`), `tokenizer.json: model.merges[0]: token "c" is not in the vocabulary`},
		{"merged token outside vocab", withField(t, "model.merges", `[["b", "a"]]`), `merged token "ba" is not in the vocabulary`},
		{"normalizer type", withField(t, "normalizer", `{"type": "Lowercase"}`), `tokenizer.json: normalizer.type "Lowercase" is not supported`},
		{"nested normalizer", withField(t, "normalizer", `{"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip"}]}`), `tokenizer.json: normalizer.normalizers[1].type "Strip" is not supported`},
		{"normalizer without type", withField(t, "normalizer", `{"prepend": "x"}`), "tokenizer.json: normalizer.type: missing"},
		{"pre-tokenizer type", withField(t, "pre_tokenizer", `{"type": "Whitespace"}`), `tokenizer.json: pre_tokenizer.type "Whitespace" is not supported`},
		{"word class", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false}`), `tokenizer.json: pre_tokenizer.pattern.Regex regex escape \w`},
		{"anchor", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"Regex": "^a"}, "behavior": "Isolated", "invert": false}`), "(anchor ^) is not supported"},
		{"script class", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"Regex": "\\p{Han}"}, "behavior": "Isolated", "invert": false}`), `regex class \p{Han} (only general categories) is not supported`},
		{"bad regex", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated", "invert": false}`), "tokenizer.json: pre_tokenizer.pattern.Regex: regex"},
		{"empty split string", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"String": ""}, "behavior": "Isolated", "invert": false}`), "tokenizer.json: pre_tokenizer.pattern.String \"\" (an empty pattern) is not supported"},
		{"split behavior", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": false}`), "tokenizer.json: pre_tokenizer.behavior: want one of"},
		{"split without invert", withField(t, "pre_tokenizer", `{"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"}`), "tokenizer.json: pre_tokenizer.invert: missing"},
		{"byte level option", withField(t, "pre_tokenizer", `{"type": "ByteLevel", "add_prefix_space": false, "lowercase": true}`), "tokenizer.json: pre_tokenizer.lowercase is not supported"},
		{"metaspace replacement", withField(t, "pre_tokenizer", `{"type": "Metaspace", "replacement": "ab"}`), "tokenizer.json: pre_tokenizer.replacement: want one character"},
		{"metaspace first after a normalizer", []byte(strings.Replace(string(withField(t, "pre_tokenizer", `{"type": "Metaspace", "replacement": "_", "prepend_scheme": "first"}`)), `"normalizer":null`, `"normalizer":{"type":"NFC"}`, 1)), `tokenizer.json: pre_tokenizer.prepend_scheme "first" with a normalizer is not supported`},
		{"metaspace first second in line", withField(t, "pre_tokenizer", `{"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, {"type": "Metaspace", "replacement": "_", "prepend_scheme": "first"}]}`), `tokenizer.json: pre_tokenizer.pretokenizers[1].prepend_scheme "first" after another pre-tokenizer is not supported`},
		{"metaspace contradiction", withField(t, "pre_tokenizer", `{"type": "Metaspace", "replacement": "_", "add_prefix_space": false, "prepend_scheme": "always"}`), "tokenizer.json: pre_tokenizer.add_prefix_space: false does not match prepend_scheme"},
		{"post-processor type", withField(t, "post_processor", `{"type": "BertProcessing"}`), `tokenizer.json: post_processor.type "BertProcessing" is not supported`},
		{"template token missing", withField(t, "post_processor", `{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}], "special_tokens": {}}`), `tokenizer.json: post_processor.single[0].SpecialToken.id: "<x>" is not in special_tokens`},
		{"template sequence B", withField(t, "post_processor", `{"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B"}}]}`), "tokenizer.json: post_processor.single[0].Sequence.id: want A"},
		{"added token id", withField(t, "added_tokens", `[{"id": 9, "content": "<s>"}]`), `tokenizer.json: added_tokens[0].id: is 9 but the library assigns 4 to "<s>"`},
		{"added token option", withField(t, "added_tokens", `[{"id": 4, "content": "<s>", "shiny": true}]`), "tokenizer.json: added_tokens[0].shiny is not supported"},
		{"added tokens matching alike", []byte(strings.Replace(string(withField(t, "added_tokens", `[{"id": 4, "content": "ﬁ", "normalized": true}, {"id": 5, "content": "fi", "normalized": true}]`)), `"normalizer":null`, `"normalizer":{"type":"NFKC"}`, 1)), `tokenizer.json: added_tokens: two tokens match "fi"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.data, DefaultConfig())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.error)
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokenizer.json")
	require.NoError(t, os.WriteFile(path, []byte(tinyJSON), 0o600))
	tok, err := Load(path)
	require.NoError(t, err)
	ids, err := tok.Encode("ab", false)
	require.NoError(t, err)
	assert.Equal(t, []uint32{2}, ids)

	_, err = Load(filepath.Join(dir, "missing.json"))
	assert.ErrorContains(t, err, "missing.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"model": {"type": "Unigram"}}`), 0o600))
	_, err = Load(path)
	assert.ErrorContains(t, err, path+`: tokenizer.json: model.type "Unigram" is not supported`)
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, DefaultConfig().Validate())
	assert.NoError(t, Config{MemoBytes: 0}.Validate())
	assert.EqualError(t, Config{MemoBytes: -1}.Validate(), "memo_bytes: must be ≥ 0")
	_, err := Parse([]byte(tinyJSON), Config{MemoBytes: -1})
	assert.Error(t, err)
}

func TestUnkTokenMissingFromVocabFailsOnUse(t *testing.T) {
	tok, err := Parse(withField(t, "model.unk_token", `"<unk>"`), DefaultConfig())
	require.NoError(t, err, "the library loads such a file too")
	ids, err := tok.Encode("ab", false)
	require.NoError(t, err)
	assert.Equal(t, []uint32{2}, ids)
	_, err = tok.Encode("x", false)
	assert.EqualError(t, err, `hf: unk_token "<unk>" is not in the vocabulary`)
}

// TestAppendEncodeAppendsEncodesIDs: AppendEncode leaves what dst holds and appends
// exactly Encode's ids, with and without special tokens, for a template that adds a
// token before the sequence, one that repeats the sequence, and the embedded Qwen3.
func TestAppendEncodeAppendsEncodesIDs(t *testing.T) {
	twice := withField(t, "post_processor", `{"type": "Sequence", "processors": [
		{"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<s>"}}], "special_tokens": {"<s>": {"ids": [4]}}},
		{"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}]}`)
	qwen3, err := LoadBuiltin("qwen3")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		tok  *Tokenizer
	}{
		{"tiny", mustParse(t, []byte(tinyJSON))},
		{"sequence twice", mustParse(t, twice)},
		{"qwen3", qwen3},
	} {
		for _, text := range []string{"", "abba ab", "a<s>b", "<|im_start|>user\nhello there<|im_end|>\n"} {
			for _, special := range []bool{false, true} {
				want, err := tc.tok.Encode(text, special)
				require.NoError(t, err)
				dst := append(make([]uint32, 0, 3), 9, 9)
				got, err := tc.tok.AppendEncode(dst, text, special)
				require.NoError(t, err)
				assert.Equal(t, append([]uint32{9, 9}, want...), got, "%s: %q, special %v", tc.name, text, special)
			}
		}
	}
}

func mustParse(t *testing.T, raw []byte) *Tokenizer {
	t.Helper()
	tok, err := Parse(raw, DefaultConfig())
	require.NoError(t, err)
	return tok
}

// TestAppendEncodeKeepsNoReferenceToItsText: a router encodes text that is a view of a
// pooled buffer it overwrites with the next prompt, so neither the segment memo nor the
// word cache may keep a key pointing into the text. Encoding a view of a buffer and then
// overwriting the buffer leaves no key inside it, and the same text encodes to the same
// ids afterwards, from the memo.
func TestAppendEncodeKeepsNoReferenceToItsText(t *testing.T) {
	tok, err := LoadBuiltin("qwen3")
	require.NoError(t, err)
	text := strings.Repeat("The router hashes blocks of sixteen tokens. ", 40) + "<|im_end|>\nshort words: a b c"
	buf := []byte(text)
	view := unsafe.String(unsafe.SliceData(buf), len(buf))
	first, err := tok.AppendEncode(nil, view, false)
	require.NoError(t, err)
	for i := range buf {
		buf[i] = 'x'
	}
	inBuf := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		return len(s) > 0 && p >= start && p < start+uintptr(len(buf))
	}
	for i := range tok.memo.entries {
		key := tok.memo.entries[i].textOf()
		assert.False(t, inBuf(key), "a memo key points into the caller's text: %.40q", key)
	}
	for i := range tok.model.cache.shards {
		for key := range tok.model.cache.shards[i].m {
			assert.False(t, inBuf(key), "a word cache key points into the caller's text: %.40q", key)
		}
	}
	hits := tok.Stats().MemoHits
	again, err := tok.AppendEncode(nil, text, false)
	require.NoError(t, err)
	assert.Equal(t, first, again)
	assert.Greater(t, tok.Stats().MemoHits, hits, "the memo found the text under its own key")
}
