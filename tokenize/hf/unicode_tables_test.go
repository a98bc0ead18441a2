package hf

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/format"
	"os"
	"slices"
	"strconv"
	"testing"
	"unicode"

	"github.com/dlclark/regexp2/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

var updateTables = flag.Bool("update", false, "rewrite unicode_tables.go from testdata/unicode-reference.json.gz")

// unicodeReference is testdata/unicode-reference.json.gz, made by gen/gen-unicode.mjs:
// what the tokenizers library's own Unicode data says, code point by code point.
type unicodeReference struct {
	Reference  string                       `json:"reference"`
	Unicode    string                       `json:"unicode"`
	Regex      map[string][][2]rune         `json:"regex"`
	Word       [][2]rune                    `json:"word"`
	Numeric    [][2]rune                    `json:"numeric"`
	Normalize  map[string]map[string][]rune `json:"normalize"`
	Composites map[string][]rune            `json:"composites"`
}

// goRegexTable is the table regexp2 reads for an escape (TestRegexpTablesAreGo checks).
func goRegexTable(name string) *unicode.RangeTable {
	switch name {
	case `\s`:
		return unicode.White_Space
	case `\d`:
		return unicode.Nd
	}
	return unicode.Categories[name[3:len(name)-1]]
}

func allRunes(yield func(rune) bool) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF || r == 1 {
			continue
		}
		if !yield(r) {
			return
		}
	}
}

// tableRanges returns the code points of the tables as sorted, merged ranges.
func tableRanges(tables ...*unicode.RangeTable) [][2]rune {
	var rs [][2]rune
	add := func(lo, hi, stride rune) {
		if stride == 1 {
			rs = append(rs, [2]rune{lo, hi})
			return
		}
		for c := lo; c <= hi; c += stride {
			rs = append(rs, [2]rune{c, c})
		}
	}
	for _, t := range tables {
		for _, r := range t.R16 {
			add(rune(r.Lo), rune(r.Hi), rune(r.Stride))
		}
		for _, r := range t.R32 {
			add(rune(r.Lo), rune(r.Hi), rune(r.Stride))
		}
	}
	return mergeRanges(rs)
}

func mergeRanges(rs [][2]rune) [][2]rune {
	slices.SortFunc(rs, func(a, b [2]rune) int { return int(a[0] - b[0]) })
	var out [][2]rune
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][1]+1 {
			out[n-1][1] = max(out[n-1][1], r[1])
		} else {
			out = append(out, r)
		}
	}
	return out
}

// diffRanges returns the code points where a and b disagree, leaving out what the
// reference did not probe (surrogates and U+0001, its separator).
func diffRanges(a, b [][2]rune) []uint32 {
	// Sweep over the boundaries of both range lists.
	type edge struct {
		at    rune
		delta int
	}
	var edges []edge
	for _, rs := range [][][2]rune{a, b} {
		for _, r := range rs {
			edges = append(edges, edge{r[0], 1}, edge{r[1] + 1, -1})
		}
	}
	slices.SortFunc(edges, func(x, y edge) int { return int(x.at - y.at) })
	var out [][2]rune
	depth := 0
	for i := 0; i < len(edges); {
		at := edges[i].at
		for i < len(edges) && edges[i].at == at {
			depth += edges[i].delta
			i++
		}
		if depth == 1 && i < len(edges) {
			out = append(out, [2]rune{at, edges[i].at - 1})
		}
	}
	var flat []uint32
	for _, r := range mergeRanges(out) {
		for _, cut := range [][2]rune{{r[0], min(r[1], 0)}, {max(r[0], 2), min(r[1], 0xD7FF)}, {max(r[0], 0xE000), r[1]}} {
			if cut[0] <= cut[1] {
				flat = append(flat, uint32(cut[0]), uint32(cut[1]))
			}
		}
	}
	return flat
}

// computedTables derives what unicode_tables.go must hold from the reference and the
// Unicode tables of the Go toolchain running the test.
type computedTables struct {
	regex               map[string][]uint32
	word, numeric       []uint32
	inertCanon, inertCK []uint32
	composites          map[rune]string
}

func computeTables(t *testing.T, ref unicodeReference) computedTables {
	t.Helper()
	c := computedTables{regex: map[string][]uint32{}, composites: map[rune]string{}}
	for name, rs := range ref.Regex {
		c.regex[name] = diffRanges(rs, tableRanges(goRegexTable(name)))
	}
	c.word = diffRanges(ref.Word, tableRanges(unicode.L, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc, unicode.Join_Control))
	c.numeric = diffRanges(ref.Numeric, tableRanges(unicode.N))
	refResult := func(form string, r rune, input string) string {
		if out, ok := ref.Normalize[form][strconv.Itoa(int(r))]; ok {
			return string(out)
		}
		return input
	}
	forms := map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}
	// Only characters the library changes, or x/text could change (a decomposition or a
	// non-zero combining class), can differ.
	candidates := map[rune]bool{}
	for _, changed := range ref.Normalize {
		for key := range changed {
			n, err := strconv.Atoi(key)
			require.NoError(t, err)
			candidates[rune(n)] = true
		}
	}
	for r := range allRunes {
		if p := norm.NFKD.PropertiesString(string(r)); p.Decomposition() != nil || p.CCC() != 0 {
			candidates[r] = true
		}
	}
	var canon, compat []rune
	for r := range allRunes {
		if !candidates[r] {
			continue
		}
		s := string(r)
		differs := map[string]bool{}
		for name, f := range forms {
			differs[name] = f.String(s) != refResult(name, r, s)
		}
		probe := "a\u0345" + s
		reorder := norm.NFD.String(probe) != refResult("NFD_after_0345", r, probe)
		if differs["NFC"] || differs["NFD"] || reorder {
			canon = append(canon, r)
		}
		if differs["NFC"] || differs["NFD"] || differs["NFKC"] || differs["NFKD"] || reorder {
			compat = append(compat, r)
			// Splitting the input at these characters reproduces the library only if
			// its tables know nothing of them: no decomposition, no reordering.
			for name := range forms {
				require.Equal(t, s, refResult(name, r, s), "U+%04X: the library's %s changes it", r, name)
			}
			require.Equal(t, probe, refResult("NFD_after_0345", r, probe), "U+%04X: the library reorders it", r)
		}
	}
	c.inertCanon, c.inertCK = mergeRangeList(runeRanges(canon)), mergeRangeList(runeRanges(compat))
	for key, out := range ref.Composites {
		n, err := strconv.Atoi(key)
		require.NoError(t, err)
		if string(out) != string(rune(n)) {
			c.composites[rune(n)] = string(out)
		}
	}
	return c
}

func readUnicodeReference(t *testing.T) unicodeReference {
	t.Helper()
	data, err := gunzipFile("testdata/unicode-reference.json.gz")
	require.NoError(t, err)
	var ref unicodeReference
	require.NoError(t, json.Unmarshal(data, &ref))
	return ref
}

// TestUnicodeTables checks that unicode_tables.go matches the reference and this Go
// toolchain's Unicode version; after a Go upgrade it fails until regenerated with
// `go test ./tokenize/hf -run TestUnicodeTables -update`.
func TestUnicodeTables(t *testing.T) {
	if testing.Short() {
		t.Skip("walks every code point")
	}
	ref := readUnicodeReference(t)
	c := computeTables(t, ref)
	if *updateTables {
		writeTables(t, ref, c)
		return
	}
	require.Equal(t, unicode.Version, tablesGoUnicode, "Go's Unicode tables changed: regenerate unicode_tables.go")
	assert.Equal(t, c.regex, regexDiffs)
	assert.Equal(t, c.word, wordDiffs)
	assert.Equal(t, c.numeric, numericDiffs)
	assert.Equal(t, c.inertCanon, normInertCanonical)
	assert.Equal(t, c.inertCK, normInertCompat)
	assert.Equal(t, c.composites, normComposites)
}

// TestRegexpTablesAreGo pins the assumption goRegexMember makes: regexp2 classes are
// Go's unicode tables.
func TestRegexpTablesAreGo(t *testing.T) {
	ref := readUnicodeReference(t)
	for name := range ref.Regex {
		re := regexp2.MustCompile(`^`+name+`$`, regexp2.None)
		table := goRegexTable(name)
		for r := rune(0); r <= unicode.MaxRune; r += 1009 {
			if r >= 0xD800 && r <= 0xDFFF {
				continue
			}
			ok, err := re.MatchString(string(r))
			require.NoError(t, err)
			require.Equal(t, unicode.Is(table, r), ok, "%s U+%04X", name, r)
		}
	}
}

func writeTables(t *testing.T, ref unicodeReference, c computedTables) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "// Code generated by go test -run TestUnicodeTables -update; DO NOT EDIT.\n\n")
	fmt.Fprintf(&b, "package hf\n\n")
	fmt.Fprintf(&b, "// The reference is %s (its Oniguruma, Rust std and normalization tables);\n", ref.Reference)
	fmt.Fprintf(&b, "// Go's side is the unicode package of Unicode %s. Ranges are inclusive [lo, hi] pairs.\n\n", unicode.Version)
	fmt.Fprintf(&b, "const tablesGoUnicode = %q\n\n", unicode.Version)
	writeRanges := func(name, doc string, rs []uint32) {
		fmt.Fprintf(&b, "// %s\nvar %s = %s\n\n", doc, name, rangesLiteral(rs))
	}
	names := make([]string, 0, len(c.regex))
	for n := range c.regex {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Fprintf(&b, "// regexDiffs: per regex escape, the code points Oniguruma and regexp2 disagree on.\nvar regexDiffs = map[string][]uint32{\n")
	for _, n := range names {
		fmt.Fprintf(&b, "\t%q: %s,\n", n, rangesLiteral(c.regex[n]))
	}
	fmt.Fprintf(&b, "}\n\n")
	writeRanges("wordDiffs", "wordDiffs: where the regex crate's \\w (single_word) and isWordRuneGo disagree.", c.word)
	writeRanges("numericDiffs", "numericDiffs: where Rust's char::is_numeric (Digits) and unicode.IsNumber disagree.", c.numeric)
	writeRanges("normInertCanonical", "normInertCanonical: characters NFC/NFD treat differently in the library (which knows\n// nothing of them) and in x/text.", c.inertCanon)
	writeRanges("normInertCompat", "normInertCompat: the same for NFKC/NFKD.", c.inertCK)
	keys := make([]rune, 0, len(c.composites))
	for r := range c.composites {
		keys = append(keys, r)
	}
	slices.Sort(keys)
	fmt.Fprintf(&b, "// normComposites: composites x/text forms that the library leaves decomposed, and what\n// the library gives for their decomposition.\nvar normComposites = map[rune]string{\n")
	for _, r := range keys {
		fmt.Fprintf(&b, "\t0x%04X: %q,\n", r, c.composites[r])
	}
	fmt.Fprintf(&b, "}\n")
	src, err := format.Source(b.Bytes())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile("unicode_tables.go", src, 0o644))
}

func rangesLiteral(rs []uint32) string {
	if len(rs) == 0 {
		return "[]uint32(nil)"
	}
	var b bytes.Buffer
	b.WriteString("[]uint32{")
	for i := 0; i < len(rs); i += 2 {
		if i%16 == 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "0x%X, 0x%X, ", rs[i], rs[i+1])
	}
	b.WriteString("\n}")
	return b.String()
}
