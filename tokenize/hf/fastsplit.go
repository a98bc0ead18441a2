package hf

import (
	"unicode"
	"unicode/utf8"
)

// Most byte-level tokenizers (Qwen 2/2.5/3, Llama 3, and others after GPT-4's cl100k)
// pre-tokenize with one of two regexes. Half of the encoding time went into running
// them on a backtracking engine, so they get a direct matcher, equivalent by
// construction (TestFastSplitMatchesTheRegex compares them on the golden corpora).
const (
	splitCL100K1 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	splitCL100K3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// cl100kSplit matches splitCL100K1 (maxDigits 1) or splitCL100K3 (3), with the
// library's Unicode tables for \p{L} and \p{N}. Its matches tile the text.
type cl100kSplit struct{ maxDigits int }

func fastSplitFor(expr string) *cl100kSplit {
	switch expr {
	case splitCL100K1:
		return &cl100kSplit{maxDigits: 1}
	case splitCL100K3:
		return &cl100kSplit{maxDigits: 3}
	}
	return nil
}

func isLetterRef(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r) != inRanges(regexDiffs[`\p{L}`], r)
}

func isNumberRef(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r) != inRanges(regexDiffs[`\p{N}`], r)
}

// isSpaceRef is \s: White_Space, the same in both engines' tables.
func isSpaceRef(r rune) bool { return unicode.IsSpace(r) }

func isCRLF(r rune) bool { return r == '\r' || r == '\n' }

// A rune's classes for the regexes, as bits: the matcher reads one table entry per
// ASCII byte instead of calling the predicates above, which it still uses beyond ASCII.
const (
	classLetter uint8 = 1 << iota // \p{L}
	classNumber                   // \p{N}
	classSpace                    // \s
	classCRLF                     // [\r\n]
	classOther                    // [^\s\p{L}\p{N}]
)

// asciiClasses are the classes of the ASCII runes; never written after initialisation.
var asciiClasses = func() (t [utf8.RuneSelf]uint8) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = runeClasses(r)
	}
	return t
}()

func runeClasses(r rune) uint8 {
	var c uint8
	if isLetterRef(r) {
		c |= classLetter
	}
	if isNumberRef(r) {
		c |= classNumber
	}
	if isSpaceRef(r) {
		c |= classSpace
	}
	if isCRLF(r) {
		c |= classCRLF
	}
	if c&(classLetter|classNumber|classSpace) == 0 {
		c |= classOther
	}
	return c
}

// classesAt returns the classes of the rune at i and its size; size 0 at the end.
func classesAt(s string, i int) (uint8, int) {
	if i >= len(s) {
		return 0, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClasses[c], 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	return runeClasses(r), size
}

func (c *cl100kSplit) matches(s string, dst [][2]int) ([][2]int, error) {
	dst, _ = c.matchesFrom(s, 0, -1, dst)
	return dst, nil
}

// matchesFrom implements [resumable]: the matches tile the text, and each depends only
// on the text from its start.
func (c *cl100kSplit) matchesFrom(s string, from, max int, dst [][2]int) ([][2]int, int) {
	i := from
	for n := 0; n != max && i < len(s); n++ {
		end := c.matchAt(s, i)
		dst = append(dst, [2]int{i, end})
		i = end
	}
	return dst, i
}

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if s[i] < utf8.RuneSelf {
		return rune(s[i]), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// run returns the end of the run of runes from i having a class in classes, stopping
// after max runes (max < 0: no limit).
func run(s string, i, max int, classes uint8) int {
	for n := 0; n != max; n++ {
		if i < len(s) && s[i] < utf8.RuneSelf {
			if asciiClasses[s[i]]&classes == 0 {
				break
			}
			i++
			continue
		}
		c, size := classesAt(s, i)
		if size == 0 || c&classes == 0 {
			break
		}
		i += size
	}
	return i
}

// matchAt returns the end of the match at i, trying the alternatives in order as a
// backtracking engine does. Every rune starts some alternative, so it is always > i.
func (c *cl100kSplit) matchAt(s string, i int) int {
	class, size := classesAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if end := contraction(s, i+1); end > 0 {
			return end
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if class&classLetter != 0 {
		return run(s, i+size, -1, classLetter)
	}
	if class&(classCRLF|classNumber) == 0 {
		if next, nsize := classesAt(s, i+size); nsize > 0 && next&classLetter != 0 {
			return run(s, i+size+nsize, -1, classLetter)
		}
	}
	// \p{N} or \p{N}{1,3}
	if class&classNumber != 0 {
		return run(s, i, c.maxDigits, classNumber)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	start := i
	if s[i] == ' ' {
		if next, nsize := classesAt(s, i+1); nsize > 0 && next&classOther != 0 {
			start = i + 1
		}
	}
	if first, fsize := classesAt(s, start); fsize > 0 && first&classOther != 0 {
		end := run(s, start, -1, classOther)
		return run(s, end, -1, classCRLF)
	}
	// What is left starts with whitespace.
	end := run(s, i, -1, classSpace)
	// \s*[\r\n]+ : up to the last line break of the run.
	for k := end; k > i; {
		r, size := utf8.DecodeLastRuneInString(s[:k])
		if isCRLF(r) {
			return k
		}
		k -= size
	}
	// \s+(?!\S) : the run, but one rune short of a following non-space.
	if end < len(s) {
		if _, last := utf8.DecodeLastRuneInString(s[:end]); end-last > i {
			return end - last
		}
	}
	// \s+
	return end
}

// contraction returns the end of 's, 't, 're, 've, 'm, 'll or 'd after the apostrophe
// ending at i, or 0. The regex's (?i) folds case the Unicode way: ſ is an s.
func contraction(s string, i int) int {
	r, size := runeAt(s, i)
	switch r {
	case 's', 'S', 'ſ', 't', 'T', 'm', 'M', 'd', 'D':
		return i + size
	case 'r', 'R', 'v', 'V':
		if r2, _ := runeAt(s, i+1); r2 == 'e' || r2 == 'E' {
			return i + 2
		}
	case 'l', 'L':
		if r2, _ := runeAt(s, i+1); r2 == 'l' || r2 == 'L' {
			return i + 2
		}
	}
	return 0
}
