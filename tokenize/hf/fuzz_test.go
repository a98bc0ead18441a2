package hf

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzTexts are encoded by every tokenizer FuzzParse manages to load.
var fuzzTexts = []string{"", "ab a<s>b", " héllo  123 🙂\n\n", "\xff\x00", "<s><s>ab"}

// FuzzParse feeds hostile tokenizer.json files to the loader: it must return an error
// or a tokenizer, never panic, and a tokenizer it returns must encode deterministically.
func FuzzParse(f *testing.F) {
	f.Add([]byte(tinyJSON))
	for _, field := range [][2]string{
		{"normalizer", `{"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Prepend", "prepend": "_"}, {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "b"}]}`},
		{"pre_tokenizer", `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+(?!\\S)|\\p{L}+"}, "behavior": "MergedWithNext", "invert": true}, {"type": "Digits", "individual_digits": false}, {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}]}`},
		{"pre_tokenizer", `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}`},
		{"post_processor", `{"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<s>"}}], "special_tokens": {"<s>": {"ids": [4, 4]}}}]}`},
		{"added_tokens", `[{"id": 4, "content": "<s>", "lstrip": true, "rstrip": true, "single_word": true}, {"id": 5, "content": "a", "normalized": true}]`},
		{"model.byte_fallback", `true`},
		{"model.unk_token", `"a"`},
		{"model.merges", `[["a", "b"]]`},
		{"model.ignore_merges", `true`},
	} {
		f.Add(withField(f, field[0], field[1]))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := Parse(data, Config{MemoBytes: 1 << 16})
		if err != nil {
			return
		}
		for _, text := range fuzzTexts {
			for _, special := range []bool{false, true} {
				first, err1 := tok.Encode(text, special)
				second, err2 := tok.Encode(text, special)
				if (err1 == nil) != (err2 == nil) || !slices.Equal(first, second) {
					t.Fatalf("%q: encoding is not deterministic: %v %v / %v %v", text, first, err1, second, err2)
				}
			}
		}
	})
}

// FuzzEncode feeds hostile text to real tokenizers: no error, no panic, ids inside the
// vocabulary, the same ids with and without the memo, prefixes that are the first ids,
// the same ids pre-tokenized in windows of two parts as whole (the direct matcher and a
// regexp2 pattern), and the direct split matchers agreeing with their regexes.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello world", "<|im_start|>user\nhi<|im_end|>\n", "<s>[INST] x [/INST]", "a\xffb",
		"   \n\n\t 12345 héllo 🙂👨‍👩‍👧 ﬁ", "\U0001F6D8\U00011935\U00011930", "<|im_start<|im_end|>|>", "▁▁ ▁"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	type pair struct {
		memo, plain *Tokenizer
		limit       uint32
	}
	var tokenizers []pair
	for _, name := range []string{"qwen3", "mistral7b"} {
		memo, plain := loadModel(f, name, Config{MemoBytes: 1 << 20}), loadModel(f, name, Config{})
		tokenizers = append(tokenizers, pair{memo, plain, map[string]uint32{"qwen3": 151669, "mistral7b": 32000}[name]})
	}
	var windowed [][2]*Tokenizer // windows of two parts, and none
	for _, name := range []string{"qwen3", "gptoss"} {
		small, whole := loadModel(f, name, Config{}), loadModel(f, name, Config{})
		ws := *small.windowed
		ws.parts = 2
		small.windowed, whole.windowed = &ws, nil
		windowed = append(windowed, [2]*Tokenizer{small, whole})
	}
	var splits []regex // the fast matchers, checked against regexp2 on every input
	for _, expr := range []string{splitCL100K1, splitCL100K3} {
		re, err := compileRegex("fuzz", expr)
		if err != nil {
			f.Fatal(err)
		}
		splits = append(splits, re)
	}
	f.Fuzz(func(t *testing.T, text string, special bool) {
		if utf8.ValidString(text) {
			for _, fast := range splits {
				slow := fast
				slow.fast = nil
				want, err := slow.matches(text, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := fast.matches(text, nil); !slices.Equal(got, want) {
					t.Fatalf("%q: direct split %v, regex %v", text, got, want)
				}
			}
		}
		for _, p := range windowed {
			got, err := p[0].Encode(text, special)
			if err != nil {
				t.Fatalf("%q: %v", text, err)
			}
			if want, _ := p[1].Encode(text, special); !slices.Equal(got, want) {
				t.Fatalf("%q: in windows %v, whole %v", text, got, want)
			}
		}
		for _, p := range tokenizers {
			for pass := 0; pass < 2; pass++ { // the second pass may come from the memo
				got, err := p.memo.Encode(text, special)
				if err != nil {
					t.Fatalf("%q: %v", text, err)
				}
				want, err := p.plain.Encode(text, special)
				if err != nil {
					t.Fatalf("%q: %v", text, err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%q: memo gives %v, without memo %v", text, got, want)
				}
				for _, id := range got {
					if id >= p.limit {
						t.Fatalf("%q: id %d outside the vocabulary", text, id)
					}
				}
				for _, maxIDs := range []int{1, len(got) / 2, len(got) - 1} {
					if maxIDs < 1 || maxIDs >= len(got) {
						continue
					}
					for _, tok := range []*Tokenizer{p.memo, p.plain} {
						prefix, rest, err := tok.AppendEncodePrefix(nil, text, special, maxIDs)
						if err != nil {
							t.Fatalf("%q: %v", text, err)
						}
						if !slices.Equal(prefix, got[:maxIDs]) || rest == 0 {
							t.Fatalf("%q: the first %d ids are %v, rest %d; whole %v", text, maxIDs, prefix, rest, got)
						}
					}
				}
			}
		}
	})
}

// FuzzUnicodeForms feeds text to each Unicode form: the result holds no CGJ the text did
// not (the library inserts none, whatever the length of a run of non-starters), the path
// for runs past 30 non-starters gives the same on its segments as on the whole text, and
// it agrees with x/text wherever x/text inserts no CGJ.
func FuzzUnicodeForms(f *testing.F) {
	for _, s := range []string{"", "héllo", "e" + strings.Repeat("\u0301", 31), "a" + strings.Repeat("\u0301\u0316", 20),
		"\ufc5e" + strings.Repeat("\u0651", 29), "\u1100\u1161" + strings.Repeat("\u0301", 31) + "\u11a8",
		"ﬁ\u32FFé" + strings.Repeat("\u0344", 16), "e" + strings.Repeat("\u0301", 35) + "\u034f\u0316\u0301",
		"o" + strings.Repeat("\u031b\u0323\u0302", 11) + " \U00011935\U00011930"} {
		f.Add(s)
	}
	forms := []unicodeForm{newUnicodeForm("NFC"), newUnicodeForm("NFD"), newUnicodeForm("NFKC"), newUnicodeForm("NFKD")}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // the encoder replaces invalid bytes before normalizing
		}
		for _, u := range forms {
			got, err := u.normalize(s)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Count(got, cgj) != strings.Count(s, cgj) {
				t.Fatalf("%+q: %+q holds a CGJ the text does not", s, got)
			}
			long := u.withoutStreamSafe(s)
			var whole strings.Builder
			u.longSegment(&whole, s, &longSegmentBuffers{})
			if long != whole.String() {
				t.Fatalf("%+q: by segments %+q, whole %+q", s, long, whole.String())
			}
			if x := u.form.String(s); strings.Count(x, cgj) == strings.Count(s, cgj) && x != long {
				t.Fatalf("%+q: %+q, x/text %+q", s, long, x)
			}
		}
	})
}
