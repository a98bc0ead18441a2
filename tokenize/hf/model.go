package hf

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// wordCacheEntries bounds the word cache: about 6 MB of short words and their ids.
const wordCacheEntries = 1 << 16

// parseBPE builds the model. Options that change how words are cut (dropout,
// continuing_subword_prefix, end_of_word_suffix) are rejected unless neutral.
func parseBPE(raw json.RawMessage) (*bpe, error) {
	o, err := parseObj("model", raw)
	if err != nil {
		return nil, err
	}
	t, err := o.typ()
	if err != nil {
		return nil, err
	}
	if t != "BPE" {
		return nil, unsupported(o.at("type"), fmt.Sprintf("%q", t))
	}
	if err := o.only("type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
		"fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"); err != nil {
		return nil, err
	}
	if o.has("dropout") {
		var d float64
		if err := json.Unmarshal(o.fields["dropout"], &d); err != nil || d != 0 {
			return nil, unsupported(o.at("dropout"), "(must be null: dropout samples ids at random)")
		}
	}
	for _, key := range []string{"continuing_subword_prefix", "end_of_word_suffix"} {
		if s, _, err := o.str(key); err != nil {
			return nil, err
		} else if s != "" {
			return nil, unsupported(o.at(key), fmt.Sprintf("%q", s))
		}
	}
	m := &bpe{unkID: -1}
	if m.fuseUnk, err = o.boolean("fuse_unk", false, true); err != nil {
		return nil, err
	}
	if m.byteFallback, err = o.boolean("byte_fallback", false, true); err != nil {
		return nil, err
	}
	if m.ignoreMerges, err = o.boolean("ignore_merges", false, true); err != nil {
		return nil, err
	}
	if m.unkToken, m.hasUnk, err = o.str("unk_token"); err != nil {
		return nil, err
	}
	if !o.has("vocab") {
		return nil, loadError(o.at("vocab"), "missing")
	}
	if m.vocab, err = decodeVocab(o.fields["vocab"]); err != nil {
		return nil, loadError(o.at("vocab"), "want an object of token → id (0 ≤ id < 2³²)")
	}
	m.vocabSize = len(m.vocab)
	if !o.has("merges") {
		return nil, loadError(o.at("merges"), "missing")
	}
	pairs, err := parseMerges(o.at("merges"), o.fields["merges"])
	if err != nil {
		return nil, err
	}
	if err := m.index(pairs, o.at("merges")); err != nil {
		return nil, err
	}
	m.cache = newWordCache(wordCacheEntries)
	return m, nil
}

// parseMerges reads merges as ["a b", …] (lines starting "#version" are skipped, as in
// a merges.txt) or [["a", "b"], …].
func parseMerges(path string, raw json.RawMessage) ([][2]string, error) {
	lines, pairs, err := decodeMerges(raw)
	if err != nil {
		return nil, loadError(path, `want an array of "left right" strings or of [left, right] pairs`)
	}
	if lines == nil {
		return pairs, nil
	}
	out := make([][2]string, 0, len(lines))
	for i, line := range lines {
		if strings.HasPrefix(line, "#version") {
			continue
		}
		left, right, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(right, " ") {
			return nil, loadError(index(path, i), "want two tokens separated by one space")
		}
		out = append(out, [2]string{left, right})
	}
	return out, nil
}

// index builds the lookup tables from the vocabulary and merges. A later duplicate of a
// pair overrides an earlier one, as in the library's map.
func (m *bpe) index(pairs [][2]string, path string) error {
	m.merges = make(map[uint64]uint64, len(pairs))
	var buf []byte
	for rank, p := range pairs {
		left, okL := m.vocab[p[0]]
		right, okR := m.vocab[p[1]]
		buf = append(append(buf[:0], p[0]...), p[1]...)
		merged, okM := m.vocab[string(buf)]
		switch {
		case !okL:
			return loadError(index(path, rank), "token %q is not in the vocabulary", p[0])
		case !okR:
			return loadError(index(path, rank), "token %q is not in the vocabulary", p[1])
		case !okM:
			return loadError(index(path, rank), "merged token %q is not in the vocabulary", p[0]+p[1])
		}
		m.merges[pairKey(left, right)] = uint64(rank)<<32 | uint64(merged)
	}
	for i := range m.lowRunes {
		m.lowRunes[i] = -1
	}
	m.runeIDs = map[rune]uint32{}
	for tok, id := range m.vocab {
		r, size := utf8.DecodeRuneInString(tok)
		if size != len(tok) || size == 0 || r == utf8.RuneError && tok != "\uFFFD" {
			continue
		}
		if r < rune(len(m.lowRunes)) {
			m.lowRunes[r] = int64(id)
		} else {
			m.runeIDs[r] = id
		}
	}
	for b := range m.fallbackIDs {
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.fallbackIDs[b] = int64(id)
		}
	}
	if m.hasUnk {
		if id, ok := m.vocab[m.unkToken]; ok {
			m.unkID = int64(id)
		}
	}
	return nil
}

// release drops what encoding does not need once loading is done.
func (m *bpe) release() {
	if !m.ignoreMerges {
		m.vocab = nil
	}
}
