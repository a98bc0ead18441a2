package hf

import (
	"cmp"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// inRanges reports whether r is in rs, inclusive [lo, hi] pairs in increasing order.
func inRanges(rs []uint32, r rune) bool {
	n := len(rs) / 2
	i := sort.Search(n, func(i int) bool { return rs[2*i+1] >= uint32(r) })
	return i < n && rs[2*i] <= uint32(r)
}

// containsAny reports whether s holds a rune in rs.
func containsAny(s string, rs []uint32) bool {
	if len(rs) == 0 {
		return false
	}
	ascii := rs[0] < utf8.RuneSelf
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			if ascii && inRanges(rs, rune(s[i])) {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if inRanges(rs, r) {
			return true
		}
		i += size
	}
	return false
}

func sortPairs(p [][2]uint32) {
	slices.SortFunc(p, func(a, b [2]uint32) int { return cmp.Compare(a[0], b[0]) })
}

// isNumeric is Rust's char::is_numeric with the library's Unicode version.
func isNumeric(r rune) bool { return unicode.IsNumber(r) != inRanges(numericDiffs, r) }

// unicodeForm is a Unicode normalization as the library computes it. Its tables are
// older than x/text's; the characters they lack (inert) are left as they are and, being
// unassigned to it, neither compose nor reorder with their neighbours. So the text is
// normalized between them by x/text, and composites x/text forms that the library does
// not know are put back as the library leaves them.
type unicodeForm struct {
	form     norm.Form
	inert    []uint32
	composes bool
}

func newUnicodeForm(name string) unicodeForm {
	switch name {
	case "NFC":
		return unicodeForm{norm.NFC, normInertCanonical, true}
	case "NFD":
		return unicodeForm{norm.NFD, normInertCanonical, false}
	case "NFKC":
		return unicodeForm{norm.NFKC, normInertCompat, true}
	}
	return unicodeForm{norm.NFKD, normInertCompat, false}
}

func (u unicodeForm) normalize(s string) (string, error) {
	if !containsAny(s, u.inert) {
		return u.run(s), nil
	}
	var b strings.Builder
	b.Grow(len(s))
	start := 0
	for i, r := range s {
		if inRanges(u.inert, r) {
			b.WriteString(u.run(s[start:i]))
			b.WriteRune(r)
			start = i + utf8.RuneLen(r)
		}
	}
	b.WriteString(u.run(s[start:]))
	return b.String(), nil
}

func (u unicodeForm) run(s string) string {
	out := u.form.String(s)
	if strings.Contains(out, cgj) && strings.Count(out, cgj) > strings.Count(s, cgj) {
		out = u.withoutStreamSafe(s)
	}
	if !u.composes || !hasComposite(out) {
		return out
	}
	var b strings.Builder
	b.Grow(len(out) + 8)
	for _, r := range out {
		if repl, ok := normComposites[r]; ok {
			b.WriteString(repl)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func hasComposite(s string) bool {
	for _, r := range s {
		if r >= utf8.RuneSelf {
			if _, ok := normComposites[r]; ok {
				return true
			}
		}
	}
	return false
}

// cgj is U+034F COMBINING GRAPHEME JOINER. x/text's forms write UAX #15's Stream-Safe
// Text Format: after 30 non-starters in a row they insert a CGJ (a starter, so the marks
// on either side of it are neither reordered nor composed across it). The library (Rust
// unicode-normalization's nfc() and the rest, as Python's unicodedata) has no such step:
// it reorders and composes a run of any length. No normalization writes a CGJ otherwise
// (none decomposes to one), so one more CGJ in x/text's output than in its input is the
// mark of a run longer than 30.
const cgj = "\u034f"

// maxStreamSafeRunes: a segment that decomposes into at most this many characters has
// at most 30 non-starters, which x/text normalizes as the library does. x/text counts
// the non-starters of compatibility decompositions in every form (UAX #15 defines the
// format over NFKD), so the segment is counted in those too.
const maxStreamSafeRunes = 30

// withoutStreamSafe normalizes s as the library does, without the stream-safe step. s is cut
// into segments, each starting at a character that combines with nothing before it
// (BoundaryBefore), which normalize independently; x/text normalizes the segments
// that decompose into at most maxStreamSafeRunes characters, and longSegment the others.
func (u unicodeForm) withoutStreamSafe(s string) string {
	var b strings.Builder
	b.Grow(len(s) + len(s)/2)
	var buf longSegmentBuffers
	short, start, n := 0, 0, 0 // short: the start of the short segments not yet written
	endSegment := func(end int) {
		if n > maxStreamSafeRunes {
			b.WriteString(u.form.String(s[short:start]))
			u.longSegment(&b, s[start:end], &buf)
			short = end
		}
	}
	for i := 0; i < len(s); {
		p := u.form.PropertiesString(s[i:])
		r, size := utf8.DecodeRuneInString(s[i:])
		if i > 0 && p.BoundaryBefore() {
			endSegment(i)
			start, n = i, 0
		}
		switch d := norm.NFKD.PropertiesString(s[i:]).Decomposition(); {
		case isHangulSyllable(r):
			n += 3
		case d != nil:
			n += utf8.RuneCount(d)
		default:
			n++
		}
		i += size
	}
	endSegment(len(s))
	b.WriteString(u.form.String(s[short:]))
	return b.String()
}

// longSegmentBuffers is the scratch of longSegment: the decomposed characters of a
// segment, and the primary composites looked up so far (-1 for none).
type longSegmentBuffers struct {
	chars    []classed
	combined map[[2]rune]rune
}

// classed is a character and its canonical combining class.
type classed struct {
	r   rune
	ccc uint8
}

// longSegment writes seg normalized per UAX #15 (and as the library does), with no limit
// on the length of a run of non-starters: the full (canonical or compatibility)
// decomposition of each character, every run of non-starters stably sorted by combining
// class, then for the composing forms canonical composition. It takes x/text's data:
// its decompositions and combining classes, and its NFC of two characters as the primary
// composite of a pair.
func (u unicodeForm) longSegment(b *strings.Builder, seg string, buf *longSegmentBuffers) {
	chars := buf.chars[:0]
	for i := 0; i < len(seg); {
		p := u.form.PropertiesString(seg[i:])
		r, size := utf8.DecodeRuneInString(seg[i:])
		i += size
		switch d := p.Decomposition(); {
		case isHangulSyllable(r):
			chars = appendHangulJamo(chars, r)
		case d != nil:
			for j := 0; j < len(d); {
				q := u.form.Properties(d[j:])
				dr, dsize := utf8.DecodeRune(d[j:])
				chars = append(chars, classed{dr, q.CCC()})
				j += dsize
			}
		default:
			chars = append(chars, classed{r, p.CCC()})
		}
	}
	for i := 0; i < len(chars); {
		if chars[i].ccc == 0 {
			i++
			continue
		}
		j := i + 1
		for j < len(chars) && chars[j].ccc != 0 {
			j++
		}
		slices.SortStableFunc(chars[i:j], func(a, b classed) int { return cmp.Compare(a.ccc, b.ccc) })
		i = j
	}
	if u.composes {
		chars = buf.compose(chars)
	}
	for _, c := range chars {
		b.WriteRune(c.r)
	}
	buf.chars = chars
}

// compose applies canonical composition to chars (decomposed and canonically ordered)
// in place: each character not blocked from the last starter (by a character between
// them of class 0 or of a class not below its own) and forming a primary composite with
// it replaces that starter with the composite.
func (buf *longSegmentBuffers) compose(chars []classed) []classed {
	out := chars[:0]
	starter := -1     // the index in out of the last starter, -1 before the first
	var lastCCC uint8 // the class of the last character after it, if any
	between := false  // whether out holds characters after the starter
	for _, c := range chars {
		if starter >= 0 && (!between || lastCCC < c.ccc) {
			if p, ok := buf.combine(out[starter].r, c.r); ok {
				out[starter].r = p
				continue
			}
		}
		if c.ccc == 0 {
			starter, between = len(out), false
		} else {
			between, lastCCC = true, c.ccc
		}
		out = append(out, c)
	}
	return out
}

// combine returns the primary composite of a and b, as x/text's NFC forms it.
func (buf *longSegmentBuffers) combine(a, b rune) (rune, bool) {
	if b < utf8.RuneSelf || norm.NFC.PropertiesString(string(b)).BoundaryBefore() {
		return 0, false // b combines with nothing before it
	}
	key := [2]rune{a, b}
	if p, ok := buf.combined[key]; ok {
		return p, p >= 0
	}
	if buf.combined == nil {
		buf.combined = make(map[[2]rune]rune)
	}
	p := rune(-1)
	if s := norm.NFC.String(string([]rune{a, b})); utf8.RuneCountInString(s) == 1 {
		p, _ = utf8.DecodeRuneInString(s)
	}
	buf.combined[key] = p
	return p, p >= 0
}

// Hangul syllables decompose algorithmically (x/text's Decomposition does not give
// theirs; combine composes them through x/text's NFC).
const (
	hangulBase  = 0xAC00
	hangulCount = 11172
	jamoLBase   = 0x1100
	jamoVBase   = 0x1161
	jamoTBase   = 0x11A7
	jamoVCount  = 21
	jamoTCount  = 28
)

func isHangulSyllable(r rune) bool { return r >= hangulBase && r < hangulBase+hangulCount }

func appendHangulJamo(chars []classed, r rune) []classed {
	s := r - hangulBase
	chars = append(chars,
		classed{jamoLBase + s/(jamoVCount*jamoTCount), 0},
		classed{jamoVBase + s%(jamoVCount*jamoTCount)/jamoTCount, 0})
	if t := s % jamoTCount; t != 0 {
		chars = append(chars, classed{jamoTBase + t, 0})
	}
	return chars
}
