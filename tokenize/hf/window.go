package hf

import (
	"fmt"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// windowParts is how many parts of a piece's first split a window holds. A window's
// words go through the rest of the pre-tokenizers and the model before the next window
// is cut, so a piece of millions of words (4 MB of digits is 4 M words) never has them
// all in memory at once, and an encode that stops early cuts no further than the window
// it stopped in. Chat turns of ordinary size fit in one or two windows.
const windowParts = 1024

// windowSplit is a pipeline whose first pre-tokenizer is a Split that keeps each part
// to itself (Isolated or Removed), the case of Qwen, Llama 3, DeepSeek and gpt-oss. Every
// later step works word by word, so cutting the first split's parts in windows, and
// sending each window through the later steps, gives the words of the whole piece in
// order, exactly.
type windowSplit struct {
	split *split
	// resume is split's pattern when it is a literal or the direct cl100k matcher,
	// whose matches are found a window at a time; regex when it is a regexp2 pattern
	// that does not look behind a match's start, whose matches are found a window at a
	// time in the piece's runes. With neither, the pattern finds a piece's matches all
	// at once, and only the later steps run in windows.
	resume resumable
	regex  *regex
	// after are the steps after split; nil: none.
	after preTokenizer
	// parts is how many parts a window holds: windowParts (tests make it small).
	parts int
}

// newWindowSplit returns the windowed form of a pre-tokenizer, or nil when its first
// step is not such a Split.
func newWindowSplit(p preTokenizer) *windowSplit {
	var after preTokenizer
	if seq, ok := p.(preSequence); ok {
		p = seq.steps[0]
		switch len(seq.steps) {
		case 1:
		case 2:
			after = seq.steps[1]
		default:
			after = preSequence{seq.steps[1:]}
		}
	}
	s, ok := p.(*split)
	if !ok || s.behavior != isolated && s.behavior != removed {
		return nil
	}
	w := &windowSplit{split: s, after: after, parts: windowParts}
	switch pat := s.pattern.(type) {
	case literal:
		w.resume = pat
	case regex:
		switch {
		case pat.fast != nil:
			w.resume = pat.fast
		case !pat.looksBehind:
			w.regex = &pat
		}
	}
	return w
}

// windows cuts one piece into windows of words ([windowSplit.cut]); nextWindow returns
// them in order.
type windows struct {
	ws    *windowSplit
	piece word
	from  int // the offset in the piece where the next window starts
	sc    *scratch
	// all are the parts left, for a pattern that finds them all at once (loaded).
	all    []part
	loaded bool
	// runes are the piece's, for a regexp2 pattern (nil until the first window); re
	// is the regex that matches the piece; fromRune is from in runes.
	runes    []rune
	ascii    bool // a rune of the piece is a byte
	re       *regexp2.Regexp
	fromRune int
}

// cut starts cutting a piece.
func (ws *windowSplit) cut(piece string, atStart bool, sc *scratch) windows {
	return windows{ws: ws, piece: word{text: piece, atStart: atStart}, sc: sc}
}

// nextWindow returns the words of the next window, through every pre-tokenizer, and
// the offset in the piece where the window starts; done once the piece is used up. The
// words are in the scratch's buffers, valid until the next call.
func (w *windows) nextWindow() (words []word, start int, done bool, err error) {
	if w.from >= len(w.piece.text) {
		return nil, w.from, true, nil
	}
	sc, s := w.sc, w.ws.split
	start = w.from
	var parts []part
	switch {
	case w.ws.resume != nil:
		parts = w.resumeParts()
	case w.ws.regex != nil:
		if parts, err = w.regexParts(); err != nil {
			return nil, start, false, err
		}
	default:
		if !w.loaded {
			// The later steps cut with sc.parts: the first split's parts get their own
			// buffer.
			all, err := findMatches(s.pattern, w.piece.text, sc)
			if err != nil {
				return nil, start, false, err
			}
			sc.firstParts = append(sc.firstParts[:0], all...)
			w.all, w.loaded = sc.firstParts, true
		}
		n := min(w.ws.parts, len(w.all))
		parts, w.all = w.all[:n], w.all[n:]
		w.from = len(w.piece.text)
		if len(w.all) > 0 {
			w.from = w.all[0].start
		}
	}
	if s.invert {
		for i := range parts {
			parts[i].isMatch = !parts[i].isMatch
		}
	}
	words = sc.keepWords(splitWord(sc.wordsOut(), w.piece, parts, s.behavior, sc))
	if w.ws.after != nil {
		if words, err = w.ws.after.preTokenize(words, sc); err != nil {
			return nil, start, false, err
		}
	}
	return words, start, false, nil
}

// resumeParts finds the next window's parts with a resumable pattern, as findMatches
// would cut them, and moves from to where the window after it starts.
func (w *windows) resumeParts() []part {
	sc := w.sc
	var next int
	sc.matches, next = w.ws.resume.matchesFrom(w.piece.text, w.from, w.ws.parts, sc.matches[:0])
	return w.partsOf(sc.matches, next)
}

// regexParts is resumeParts for a regexp2 pattern that does not look behind a match's
// start. From the end of a match, the search of the runes from there finds the whole
// text's next matches (its look-aheads see the text after), but for one: an empty match
// at that end, which the whole text's iteration drops (regexp2's FindAll, as Oniguruma's
// iterator in the library) and a new search does not. It is dropped here too; kept, it
// would cut nothing (the window starts there), but a window of one part would then find
// only it, again and again.
func (w *windows) regexParts() ([]part, error) {
	text, sc := w.piece.text, w.sc
	first := w.runes == nil
	n := w.ws.parts
	if first {
		count := utf8.RuneCountInString(text)
		w.ascii = count == len(text)
		if count <= cap(sc.runes) {
			w.runes = sc.runes[:0]
			for _, r := range text {
				w.runes = append(w.runes, r)
			}
		} else {
			// Not zeroed first, as a grown buffer would be: a piece of megabytes
			// spends more time clearing its runes than finding their matches.
			w.runes = []rune(text)
			sc.runes = w.runes
		}
		w.re = w.ws.regex.forText(text)
	} else {
		n++ // room for the empty match dropped, so that the window moves on
	}
	found, err := w.re.FindAllRunesIndex(w.runes[w.fromRune:], n)
	if err != nil {
		return nil, fmt.Errorf("hf: regex %q: %w", w.ws.regex.re.String(), err)
	}
	more := len(found) == n // more matches may follow the last one
	if !first && len(found) > 0 && found[0][0] == 0 && found[0][1] == 0 {
		found = found[1:]
	}
	// Rune offsets to byte offsets, walking forward from the window's start.
	sc.matches = sc.matches[:0]
	atRune, atByte := w.fromRune, w.from
	toByte := func(r int) int {
		if w.ascii {
			return r
		}
		for ; atRune < r; atRune++ {
			_, size := utf8.DecodeRuneInString(text[atByte:])
			atByte += size
		}
		return atByte
	}
	for _, m := range found {
		start := toByte(w.fromRune + m[0])
		sc.matches = append(sc.matches, [2]int{start, toByte(w.fromRune + m[1])})
	}
	next := len(text)
	if more && len(found) > 0 {
		next = sc.matches[len(sc.matches)-1][1]
		w.fromRune += found[len(found)-1][1]
	}
	return w.partsOf(sc.matches, next), nil
}

// partsOf cuts the text from from to next into the window's matches and the text
// between them, as findMatches does, and moves from to next.
func (w *windows) partsOf(matches [][2]int, next int) []part {
	sc := w.sc
	parts, prev := sc.firstParts[:0], w.from
	for _, m := range matches {
		if prev != m[0] {
			parts = append(parts, part{prev, m[0], false})
		}
		parts = append(parts, part{m[0], m[1], true})
		prev = m[1]
	}
	if prev != next { // no match is left: the text after the last one
		parts = append(parts, part{prev, next, false})
	}
	sc.firstParts, w.from = parts, next
	return parts
}
