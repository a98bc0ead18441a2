package hf

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedVocab finds added tokens in text: raw matches tokens with normalized=false in the
// input, normalized matches the others in each normalized segment. Either is nil when it
// has no tokens.
type addedVocab struct {
	raw, normalized *tokenMatcher
}

// tokenMatcher cuts text at the tokens of a byte trie, leftmost-longest, as the
// library's Aho–Corasick automaton (MatchKind::LeftmostLongest) does. Added tokens are
// many (Gemma 3 has 6,415) but short, so walking the trie from each position whose byte
// can start a token costs at most the longest token's length per position.
type tokenMatcher struct {
	first [256]int32 // child of the root per first byte; -1: none
	// onlyFirst is the first byte of every token when they share one (the "<" of most
	// special tokens), so the text can be scanned for it with strings.IndexByte.
	onlyFirst    byte
	oneFirstByte bool
	nodes        []trieNode
	edges        []trieEdge // each node's edges, sorted by byte
	tokens       []matchToken
}

type trieNode struct {
	edgeStart, edgeEnd int32
	token              int32 // index in tokens of the token ending here; -1: none
}

type trieEdge struct {
	b     byte
	child int32
}

type matchToken struct {
	id                         uint32
	singleWord, lstrip, rstrip bool
}

// span is a piece of text: an added token (id ≥ 0) or text to encode (id -1).
type span struct {
	start, end int
	id         int64
}

func buildAddedVocab(byID map[uint32]addedToken, norm normalizer) (addedVocab, error) {
	raw := map[string]matchToken{}
	normalized := map[string]matchToken{}
	ids := make([]uint32, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		tok := byID[id]
		m := matchToken{id: id, singleWord: tok.SingleWord, lstrip: tok.LStrip, rstrip: tok.RStrip}
		set, pattern := raw, tok.Content
		if tok.Normalized {
			set = normalized
			if norm != nil {
				var err error
				if pattern, err = norm.normalize(pattern); err != nil {
					return addedVocab{}, loadError("added_tokens", "normalize %q: %v", tok.Content, err)
				}
			}
		}
		if pattern == "" {
			return addedVocab{}, loadError("added_tokens", "token %d (%q) normalizes to an empty string", id, tok.Content)
		}
		if _, dup := set[pattern]; dup {
			return addedVocab{}, loadError("added_tokens", "two tokens match %q (the library cannot build its matcher)", pattern)
		}
		set[pattern] = m
	}
	return addedVocab{raw: newTokenMatcher(raw), normalized: newTokenMatcher(normalized)}, nil
}

func newTokenMatcher(patterns map[string]matchToken) *tokenMatcher {
	if len(patterns) == 0 {
		return nil
	}
	keys := make([]string, 0, len(patterns))
	for k := range patterns {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Build a map-based trie, then flatten it into sorted edge lists.
	type buildNode struct {
		children map[byte]int
		token    int32
	}
	build := []buildNode{{children: map[byte]int{}, token: -1}}
	m := &tokenMatcher{}
	for _, k := range keys {
		n := 0
		for i := 0; i < len(k); i++ {
			next, ok := build[n].children[k[i]]
			if !ok {
				next = len(build)
				build[n].children[k[i]] = next
				build = append(build, buildNode{children: map[byte]int{}, token: -1})
			}
			n = next
		}
		build[n].token = int32(len(m.tokens))
		m.tokens = append(m.tokens, patterns[k])
	}
	m.nodes = make([]trieNode, len(build))
	for i := range m.first {
		m.first[i] = -1
	}
	for i, bn := range build {
		bs := make([]int, 0, len(bn.children))
		for b := range bn.children {
			bs = append(bs, int(b))
		}
		sort.Ints(bs)
		m.nodes[i] = trieNode{edgeStart: int32(len(m.edges)), token: bn.token}
		for _, b := range bs {
			m.edges = append(m.edges, trieEdge{b: byte(b), child: int32(bn.children[byte(b)])})
			if i == 0 {
				m.first[b] = int32(bn.children[byte(b)])
			}
		}
		m.nodes[i].edgeEnd = int32(len(m.edges))
	}
	if root := m.nodes[0]; root.edgeEnd-root.edgeStart == 1 {
		m.oneFirstByte, m.onlyFirst = true, m.edges[root.edgeStart].b
	}
	return m
}

// longestAt returns the longest token starting at text[i:].
func (m *tokenMatcher) longestAt(text string, i int) (end int, tok int32) {
	tok = -1
	n := m.first[text[i]]
	for j := i + 1; n >= 0; j++ {
		node := &m.nodes[n]
		if node.token >= 0 {
			end, tok = j, node.token
		}
		if j == len(text) {
			break
		}
		n = m.child(node, text[j])
	}
	return end, tok
}

func (m *tokenMatcher) child(node *trieNode, b byte) int32 {
	edges := m.edges[node.edgeStart:node.edgeEnd]
	lo, hi := 0, len(edges)
	for lo < hi {
		mid := (lo + hi) / 2
		switch {
		case edges[mid].b == b:
			return edges[mid].child
		case edges[mid].b < b:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}

// split cuts text into added tokens and the text between them, reproducing the
// library's AddedVocabulary::find_matches: single_word tokens only match between
// non-word characters, lstrip and rstrip tokens absorb the whitespace beside them. A
// nil matcher returns the whole text.
func (m *tokenMatcher) split(text string, spans []span) []span {
	if m == nil || text == "" {
		return append(spans, span{0, len(text), -1})
	}
	offset := 0 // end of the last token taken
	for i := 0; i < len(text); {
		if m.oneFirstByte {
			next := strings.IndexByte(text[i:], m.onlyFirst)
			if next < 0 {
				break
			}
			i += next
		} else if m.first[text[i]] < 0 {
			i++
			continue
		}
		end, ti := m.longestAt(text, i)
		if ti < 0 {
			i++
			continue
		}
		start, stop, tok := i, end, m.tokens[ti]
		i = end // the automaton resumes after the match, whatever stripping does
		if tok.singleWord {
			startOK := start == 0 || !endsWithWord(text[:start])
			stopOK := stop == len(text) || !startsWithWord(text[stop:])
			if !startOK || !stopOK {
				continue
			}
		}
		if tok.lstrip {
			start = max(trailingSpaceStart(text[:start]), offset)
		}
		if tok.rstrip {
			stop += leadingSpaceLen(text[stop:])
		}
		if offset < start {
			spans = append(spans, span{offset, start, -1})
		}
		spans = append(spans, span{start, stop, int64(tok.id)})
		offset = stop
	}
	if offset != len(text) {
		spans = append(spans, span{offset, len(text), -1})
	}
	return spans
}

// isWordRune is the Rust regex crate's Unicode \w (Alphabetic, marks, decimal digits,
// connector punctuation, join controls) with the library's Unicode version.
func isWordRune(r rune) bool { return isWordRuneGo(r) != inRanges(wordDiffs, r) }

// isWordRuneGo is that \w from Go's Unicode tables.
func isWordRuneGo(r rune) bool {
	return unicode.IsLetter(r) || unicode.In(r, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}

// trailingSpaceStart returns where the run of whitespace ending s begins (regex \s*$).
func trailingSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= size
	}
	return i
}

// leadingSpaceLen returns the length of the run of whitespace starting s (regex ^\s*).
func leadingSpaceLen(s string) int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += size
	}
	return i
}
