package hf

import (
	"strings"
	"unicode/utf8"
)

// word is a piece of normalized text on its way through the pre-tokenizers; after the
// last one each word is encoded by the model on its own. atStart: the word begins at
// offset 0 of the input (only Metaspace's prepend_scheme "first" reads it).
type word struct {
	text    string
	atStart bool
}

// preTokenizer splits words into smaller words (and may rewrite them). Implementations
// are immutable.
type preTokenizer interface {
	preTokenize(words []word, sc *scratch) ([]word, error)
}

// behavior is a SplitDelimiterBehavior: what becomes of the delimiters a split finds.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]behavior{
	"Removed": removed, "Isolated": isolated, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// splitWord cuts w at parts, following the library's NormalizedString::split for
// behavior b, and appends the non-empty words to out.
func splitWord(out []word, w word, parts []part, b behavior, sc *scratch) []word {
	cuts := sc.cuts[:0]
	switch b {
	case isolated:
		for _, p := range parts {
			cuts = append(cuts, cut{p.start, p.end, false})
		}
	case removed:
		for _, p := range parts {
			cuts = append(cuts, cut{p.start, p.end, p.isMatch})
		}
	case contiguous:
		prev := false
		for _, p := range parts {
			if p.isMatch == prev && len(cuts) > 0 {
				cuts[len(cuts)-1].end = p.end
			} else {
				cuts = append(cuts, cut{p.start, p.end, false})
			}
			prev = p.isMatch
		}
	case mergedWithPrevious:
		prev := false
		for _, p := range parts {
			if p.isMatch && !prev && len(cuts) > 0 {
				cuts[len(cuts)-1].end = p.end
			} else {
				cuts = append(cuts, cut{p.start, p.end, false})
			}
			prev = p.isMatch
		}
	case mergedWithNext:
		prev := false
		for i := len(parts) - 1; i >= 0; i-- {
			p := parts[i]
			if p.isMatch && !prev && len(cuts) > 0 {
				cuts[len(cuts)-1].start = p.start
			} else {
				cuts = append(cuts, cut{p.start, p.end, false})
			}
			prev = p.isMatch
		}
		for i, j := 0, len(cuts)-1; i < j; i, j = i+1, j-1 {
			cuts[i], cuts[j] = cuts[j], cuts[i]
		}
	}
	sc.cuts = cuts
	for _, c := range cuts {
		if c.remove || c.start == c.end {
			continue
		}
		out = append(out, word{text: w.text[c.start:c.end], atStart: w.atStart && c.start == 0})
	}
	return out
}

// split is the Split pre-tokenizer.
type split struct {
	pattern  pattern
	behavior behavior
	invert   bool
}

func (s *split) preTokenize(words []word, sc *scratch) ([]word, error) {
	out := sc.wordsOut()
	for _, w := range words {
		parts, err := findMatches(s.pattern, w.text, sc)
		if err != nil {
			return nil, err
		}
		if s.invert {
			for i := range parts {
				parts[i].isMatch = !parts[i].isMatch
			}
		}
		out = splitWord(out, w, parts, s.behavior, sc)
	}
	return sc.keepWords(out), nil
}

// byteLevel is the ByteLevel pre-tokenizer: an optional leading space, the GPT-2 split,
// then each byte written as its GPT-2 character.
type byteLevel struct {
	addPrefixSpace bool
	gpt2           *regex // nil: use_regex false
}

// gpt2Split is the regex the library's ByteLevel pre-tokenizer splits with.
const gpt2Split = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func (b *byteLevel) preTokenize(words []word, sc *scratch) ([]word, error) {
	out := words
	if b.addPrefixSpace || b.gpt2 != nil {
		out = sc.wordsOut()
		for _, w := range words {
			if b.addPrefixSpace && !strings.HasPrefix(w.text, " ") {
				w.text = " " + w.text
			}
			if b.gpt2 == nil {
				out = append(out, w)
				continue
			}
			parts, err := findMatches(b.gpt2, w.text, sc)
			if err != nil {
				return nil, err
			}
			out = splitWord(out, w, parts, isolated, sc)
		}
		out = sc.keepWords(out)
	}
	byteLevelWords(out, sc)
	return out, nil
}

// byteRunes maps each byte to the printable character GPT-2's byte-level BPE spells it
// with: printable Latin-1 bytes stand for themselves, the others for 256 + n in order.
var byteRunes = func() (m [256]rune) {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			m[b] = rune(b)
		} else {
			m[b] = 256 + n
			n++
		}
	}
	return m
}()

// byteLevelWords rewrites each word's text in GPT-2's byte characters. The texts are
// written into one string, each word a slice of it: one allocation per piece, not one
// per word (the word cache copies any text it keeps).
func byteLevelWords(words []word, sc *scratch) {
	buf, ends := sc.bytes[:0], sc.ends[:0]
	for _, w := range words {
		for i := 0; i < len(w.text); i++ {
			buf = utf8.AppendRune(buf, byteRunes[w.text[i]])
		}
		ends = append(ends, len(buf))
	}
	all := string(buf)
	start := 0
	for i, end := range ends {
		words[i].text = all[start:end]
		start = end
	}
	sc.bytes, sc.ends = buf, ends
}

type prependScheme int

const (
	prependAlways prependScheme = iota
	prependNever
	prependFirst
)

// metaspace is the Metaspace pre-tokenizer: spaces become the replacement character,
// which is prepended per the scheme and optionally splits words (merged with the next).
type metaspace struct {
	replacement rune
	scheme      prependScheme
	split       bool
}

func (m *metaspace) preTokenize(words []word, sc *scratch) ([]word, error) {
	rep := string(m.replacement)
	out := sc.wordsOut()
	for _, w := range words {
		w.text = strings.ReplaceAll(w.text, " ", rep)
		if !strings.HasPrefix(w.text, rep) && (m.scheme == prependAlways || m.scheme == prependFirst && w.atStart) {
			w.text = rep + w.text
		}
		if !m.split {
			out = append(out, w)
			continue
		}
		parts, _ := findMatches(literal(rep), w.text, sc)
		out = splitWord(out, w, parts, mergedWithNext, sc)
	}
	return sc.keepWords(out), nil
}

// digits is the Digits pre-tokenizer: numeric characters (Rust's char::is_numeric, the
// N categories) each on their own, or in runs.
type digits struct{ individual bool }

func (d digits) preTokenize(words []word, sc *scratch) ([]word, error) {
	b := contiguous
	if d.individual {
		b = isolated
	}
	out := sc.wordsOut()
	for _, w := range words {
		sc.parts = charParts(sc.parts[:0], w.text, isNumeric)
		out = splitWord(out, w, sc.parts, b, sc)
	}
	return sc.keepWords(out), nil
}

// charParts is find_matches for a character predicate: each matching character is its
// own match, the runs between them are not. It appends to parts.
func charParts(parts []part, s string, match func(rune) bool) []part {
	last := 0
	for i, r := range s {
		if !match(r) {
			continue
		}
		if last < i {
			parts = append(parts, part{last, i, false})
		}
		end := i + utf8.RuneLen(r)
		parts = append(parts, part{i, end, true})
		last = end
	}
	if last < len(s) {
		parts = append(parts, part{last, len(s), false})
	}
	return parts
}

type preSequence struct{ steps []preTokenizer }

func (s preSequence) preTokenize(words []word, sc *scratch) ([]word, error) {
	var err error
	for _, step := range s.steps {
		if words, err = step.preTokenize(words, sc); err != nil {
			return nil, err
		}
	}
	return words, nil
}
