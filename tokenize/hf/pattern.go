package hf

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// pattern finds the delimiters of Split and Replace.
type pattern interface {
	// matches appends the byte ranges of successive non-overlapping matches in s.
	matches(s string, dst [][2]int) ([][2]int, error)
}

// literal matches a string, as the library's escaped regex does.
type literal string

func (l literal) matches(s string, dst [][2]int) ([][2]int, error) {
	dst, _ = l.matchesFrom(s, 0, -1, dst)
	return dst, nil
}

// matchesFrom implements [resumable].
func (l literal) matchesFrom(s string, from, max int, dst [][2]int) ([][2]int, int) {
	i := from
	for n := 0; n != max && i <= len(s); n++ {
		j := strings.Index(s[i:], string(l))
		if j < 0 {
			return dst, len(s)
		}
		dst = append(dst, [2]int{i + j, i + j + len(l)})
		i += j + len(l)
	}
	return dst, i
}

// resumable is a pattern whose matches can be found a few at a time: the search from
// the end of a match finds the same next matches as the search over the whole text,
// with no match empty. The windowed pre-tokenizer (window.go) uses it to cut a long
// piece without holding all of its matches at once.
type resumable interface {
	// matchesFrom appends at most max (< 0: every) successive matches of s found from
	// offset from, the end of an earlier match or 0, and returns the offset where the
	// next search starts: the end of the last match, or len(s) when none is left.
	matchesFrom(s string, from, max int, dst [][2]int) ([][2]int, int)
}

// regex matches a pattern written for Oniguruma, the library's engine, with regexp2,
// whose syntax and semantics agree on the constructs tokenizers use (look-ahead,
// Unicode classes \p{..}, \s, scoped (?i:..)). Its iteration drops an empty match at the
// end of the previous match, as Oniguruma's iterator in the library does.
type regex struct {
	re *regexp2.Regexp
	// fixed is re rewritten for the library's Unicode tables (see fixRegex), used on
	// texts holding a rune of trigger; nil when re needs no rewrite.
	fixed   *regexp2.Regexp
	trigger []uint32
	// fast, when set, replaces both (see fastsplit.go).
	fast *cl100kSplit
	// looksBehind: the pattern may read text before a match's start (a look-behind,
	// \b, \B, \G, \A), so its matches after an offset cannot be found by searching
	// the text from there (window.go).
	looksBehind bool
}

// forText returns the compiled regex that matches s as the library does.
func (r regex) forText(s string) *regexp2.Regexp {
	if r.fixed != nil && containsAny(s, r.trigger) {
		return r.fixed
	}
	return r.re
}

func (r regex) matches(s string, dst [][2]int) ([][2]int, error) {
	if r.fast != nil {
		return r.fast.matches(s, dst)
	}
	m, err := r.forText(s).FindAllStringIndex(s, -1)
	if err != nil {
		return nil, fmt.Errorf("hf: regex %q: %w", r.re.String(), err)
	}
	for _, x := range m {
		dst = append(dst, [2]int{x[0], x[1]})
	}
	return dst, nil
}

// compileRegex compiles a tokenizer.json regex, rejecting constructs on which Oniguruma
// and regexp2 disagree: the anchors ^ and $ (line anchors in Oniguruma's default syntax,
// text anchors in regexp2) and set operations inside classes.
func compileRegex(path, expr string) (regex, error) {
	inClass := false
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '\\':
			i++
		case inClass && c == ']':
			inClass = false
		case inClass && (strings.HasPrefix(expr[i:], "&&") || strings.HasPrefix(expr[i:], "-[")):
			return regex{}, unsupported(path, fmt.Sprintf("regex %q (a class set operation)", expr))
		case c == '[':
			inClass = true
		case !inClass && (c == '^' || c == '$'):
			return regex{}, unsupported(path, fmt.Sprintf("regex %q (anchor %c)", expr, c))
		}
	}
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return regex{}, loadError(path, "regex %q: %v", expr, err)
	}
	fixedExpr, trigger, err := fixRegex(path, expr)
	if err != nil || fixedExpr == "" {
		return regex{re: re, fast: fastSplitFor(expr), looksBehind: looksBehind(expr)}, err
	}
	fixed, err := regexp2.Compile(fixedExpr, regexp2.None)
	if err != nil {
		return regex{}, loadError(path, "regex %q rewritten for the library's Unicode version: %v", expr, err)
	}
	return regex{re: re, fixed: fixed, trigger: trigger, fast: fastSplitFor(expr),
		looksBehind: looksBehind(expr) || looksBehind(fixedExpr)}, nil
}

// looksBehind reports whether expr may read text before a match's start: a
// look-behind (or, to keep the check simple, a named group: both start "(?<"), a word
// boundary or its negation, \G or \A, anywhere, even escaped in a class.
func looksBehind(expr string) bool {
	for i := 0; i < len(expr); i++ {
		switch {
		case expr[i] == '\\' && i+1 < len(expr):
			if strings.IndexByte("bBGA", expr[i+1]) >= 0 {
				return true
			}
			i++
		case strings.HasPrefix(expr[i:], "(?<"):
			return true
		}
	}
	return false
}

// parsePattern reads {"String": s} or {"Regex": r}.
func parsePattern(path string, raw json.RawMessage) (pattern, error) {
	o, err := parseObj(path, raw)
	if err != nil {
		return nil, err
	}
	if len(o.fields) != 1 {
		return nil, loadError(path, `want {"String": …} or {"Regex": …}`)
	}
	if s, ok, err := o.str("String"); err != nil {
		return nil, err
	} else if ok {
		if s == "" {
			return nil, unsupported(o.at("String"), "\"\" (an empty pattern)")
		}
		return literal(s), nil
	}
	if r, ok, err := o.str("Regex"); err != nil {
		return nil, err
	} else if ok {
		return compileRegex(o.at("Regex"), r)
	}
	return nil, loadError(path, `want {"String": …} or {"Regex": …}`)
}

// part is a piece of text cut by a pattern: a match or the text between matches.
type part struct {
	start, end int
	isMatch    bool
}

// findMatches cuts non-empty s into matches and the text between them, covering all of
// s in order (the library's Pattern::find_matches). Empty matches are kept: they
// delimit, and the split behaviours treat them as matches.
// The parts are in sc's buffer, valid until its next findMatches.
func findMatches(p pattern, s string, sc *scratch) ([]part, error) {
	ms, err := p.matches(s, sc.matches[:0])
	if err != nil {
		return nil, err
	}
	sc.matches = ms
	parts := sc.parts[:0]
	prev := 0
	for _, m := range ms {
		if prev != m[0] {
			parts = append(parts, part{prev, m[0], false})
		}
		parts = append(parts, part{m[0], m[1], true})
		prev = m[1]
	}
	if prev != len(s) {
		parts = append(parts, part{prev, len(s), false})
	}
	sc.parts = parts
	return parts, nil
}
