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
