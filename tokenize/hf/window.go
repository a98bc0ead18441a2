package hf

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
	// resume is split's pattern when its matches can be found a window at a time
	// (literals, the direct cl100k matcher); nil when the pattern finds them all at
	// once (regexp2), and then only the later steps run in windows.
	resume resumable
	// after are the steps after split; nil: none.
	after preTokenizer
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
	w := &windowSplit{split: s, after: after}
	switch pat := s.pattern.(type) {
	case literal:
		w.resume = pat
	case regex:
		if pat.fast != nil {
			w.resume = pat.fast
		}
	}
	return w
}

// windows cuts one piece into windows of words ([windowSplit.cut]); nextWindow returns
// them in order.
type windows struct {
	ws     *windowSplit
	piece  word
	from   int    // the offset in the piece where the next window starts
	all    []part // every part, for a pattern that cannot resume
	sc     *scratch
	loaded bool
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
	if w.ws.resume != nil {
		parts, w.from = w.resumeParts()
	} else {
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
		n := min(windowParts, len(w.all))
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

// resumeParts finds the next window's parts, as findMatches would cut them, and returns
// them with the offset where the window after it starts.
func (w *windows) resumeParts() ([]part, int) {
	sc, s := w.sc, w.piece.text
	var next int
	sc.matches, next = w.ws.resume.matchesFrom(s, w.from, windowParts, sc.matches[:0])
	parts, prev := sc.firstParts[:0], w.from
	for _, m := range sc.matches {
		if prev != m[0] {
			parts = append(parts, part{prev, m[0], false})
		}
		parts = append(parts, part{m[0], m[1], true})
		prev = m[1]
	}
	if prev != next { // no match is left: the text after the last one
		parts = append(parts, part{prev, next, false})
	}
	sc.firstParts = parts
	return parts, next
}
