package hf

// scratch holds one encode call's working buffers. Pre-tokenizing cuts every piece into
// matches, parts, cuts and words; reusing the buffers across the pieces of a call, and
// across calls through the Tokenizer's pool, keeps the garbage of an encode to its
// output and one string per piece. A scratch is used by one goroutine at a time.
type scratch struct {
	matches [][2]int
	parts   []part
	// firstParts are the parts of the windowed first split (window.go), which the
	// later steps' cuts must not overwrite; runes are the piece its regexp2 pattern
	// searches.
	firstParts []part
	runes      []rune
	cuts       []cut
	// words alternate: a pre-tokenizer step reads one and writes the other.
	words [2][]word
	// wordsUsed is the most of each words buffer a call wrote: its words point into
	// the call's text, which trimmed lets go of.
	wordsUsed [2]int
	next      int // the index in words the next step writes
	bytes     []byte
	ends      []int
	// rawSpans and normalizedSpans are the added-token splits of a call's text and of
	// the normalized segment being encoded (one is read while the other is written).
	rawSpans, normalizedSpans []span
}

// maxKeptEntries bounds each buffer a pooled scratch keeps (maxKeptEntries words,
// parts…, 4·maxKeptEntries bytes, about a 32 KiB piece's worth): a scratch that one
// larger piece grew would otherwise keep that growth, tens of megabytes for a piece of
// a megabyte, for as long as encodes keep reusing it. A larger piece allocates anew.
const maxKeptEntries = 1 << 13

// trimmed drops the buffers grown past maxKeptEntries and returns sc, to be pooled.
func (sc *scratch) trimmed() *scratch {
	if cap(sc.matches) > maxKeptEntries {
		sc.matches = nil
	}
	if cap(sc.parts) > maxKeptEntries {
		sc.parts = nil
	}
	if cap(sc.firstParts) > maxKeptEntries {
		sc.firstParts = nil
	}
	if cap(sc.runes) > 4*maxKeptEntries {
		sc.runes = nil
	}
	if cap(sc.cuts) > maxKeptEntries {
		sc.cuts = nil
	}
	for i := range sc.words {
		if cap(sc.words[i]) > maxKeptEntries {
			sc.words[i] = nil
		} else {
			clear(sc.words[i][:sc.wordsUsed[i]])
		}
		sc.wordsUsed[i] = 0
	}
	if cap(sc.bytes) > 4*maxKeptEntries {
		sc.bytes = nil
	}
	if cap(sc.ends) > maxKeptEntries {
		sc.ends = nil
	}
	if cap(sc.rawSpans) > maxKeptEntries {
		sc.rawSpans = nil
	}
	if cap(sc.normalizedSpans) > maxKeptEntries {
		sc.normalizedSpans = nil
	}
	return sc
}

// cut is a piece of a word a split keeps (or drops, if remove).
type cut struct {
	start, end int
	remove     bool
}

// startWords returns the words a piece starts as: itself.
func (sc *scratch) startWords(piece string, atStart bool) []word {
	sc.words[0] = append(sc.words[0][:0], word{text: piece, atStart: atStart})
	sc.wordsUsed[0] = max(sc.wordsUsed[0], 1)
	sc.next = 1
	return sc.words[0]
}

// wordsOut returns an empty buffer for a step's output, one that is not its input.
func (sc *scratch) wordsOut() []word { return sc.words[sc.next][:0] }

// keepWords keeps out (grown from wordsOut) for reuse and makes the other buffer the
// next step's output.
func (sc *scratch) keepWords(out []word) []word {
	sc.words[sc.next] = out
	sc.wordsUsed[sc.next] = max(sc.wordsUsed[sc.next], len(out))
	sc.next ^= 1
	return out
}
