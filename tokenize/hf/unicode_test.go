package hf

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

func TestFixRegexFollowsTheLibrarysTables(t *testing.T) {
	const landslide = '\U0001F6D8' // an emoji of Unicode 17: a symbol to Go, unassigned to the library
	tests := []struct {
		name   string
		expr   string
		text   string
		goes   bool // the regex as Go's tables read it
		wanted bool // as the library reads it
	}{
		{"symbol escape", `\p{S}`, string(landslide), true, false},
		{"negated escape", `\P{S}`, string(landslide), false, true},
		{"class with a symbol escape", `[\p{P}\p{S}]`, string(landslide), true, false},
		{"negated class", `[^\s\p{L}\p{N}]`, string(landslide), true, true},
		{"negated class of symbols", `[^\p{S}a]`, string(landslide), false, true},
		{"plain items still match", `[\p{S}\x{1F6D8}]`, string(landslide), true, true},
		{"old symbols still match", `\p{S}`, "€", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole := `\A(?:` + tt.expr + `)\z`
			fixed, trigger, err := fixRegex("test", whole)
			require.NoError(t, err)
			goes, err := regexp2.MustCompile(whole, regexp2.None).MatchString(tt.text)
			require.NoError(t, err)
			assert.Equal(t, tt.goes, goes)
			if fixed == "" {
				assert.Equal(t, tt.goes, tt.wanted, "no rewrite, yet the engines disagree")
				return
			}
			if tt.goes != tt.wanted {
				assert.True(t, inRanges(trigger, landslide), "the text must select the rewritten regex")
			}
			got, err := regexp2.MustCompile(fixed, regexp2.None).MatchString(tt.text)
			require.NoError(t, err)
			assert.Equal(t, tt.wanted, got, fixed)
		})
	}
}

func TestFixRegexLeavesUnaffectedRegexesAlone(t *testing.T) {
	for _, expr := range []string{`[a-z]+`, `\p{Lt}|\p{Zs}`, `'s|'t| ?[^\r\n]+`, `\x41\u0042\k<n>`} {
		fixed, trigger, err := fixRegex("test", expr)
		require.NoError(t, err, expr)
		assert.Empty(t, fixed, expr)
		assert.Empty(t, trigger, expr)
	}
}

func TestUnicodeFormsFollowTheLibrarysTables(t *testing.T) {
	tests := []struct {
		name, form, in, want string
	}{
		// Dives Akuru (Unicode 13): x/text composes U+11935 U+11930 into U+11938; the
		// library's tables predate it.
		{"no composition the library lacks", "NFC", "\U00011935\U00011930", "\U00011935\U00011930"},
		{"old compositions still happen", "NFC", "e\u0301", "é"},
		// U+32FF (Unicode 12.1) has a compatibility decomposition the library lacks.
		{"no decomposition the library lacks", "NFKC", "\u32FF ﬁ", "\u32FF fi"},
		{"text around an inert character still normalizes", "NFKD", "ﬁ\u32FFé", "fi\u32FFe\u0301"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := newUnicodeForm(tt.form).normalize(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	assert.Equal(t, "\U00011938", norm.NFC.String("\U00011935\U00011930"), "x/text alone composes: the case tests something")
}

// TestLongCombiningRunsEncodeAsTheLibrary: Qwen3's normalizer is NFC. x/text's forms
// write UAX #15's Stream-Safe Text Format: after 30 non-starters in a row they insert
// U+034F COMBINING GRAPHEME JOINER, which the library (Rust unicode-normalization, as
// Python's unicodedata) never does. kvroute normalizes such runs without it; before, the
// ids carried 0x89 0xed, the bytes of the CGJ, and every KV block after it missed. Ids
// of npm tokenizers@0.23.2 (the golden corpus has more such cases, for every form).
func TestLongCombiningRunsEncodeAsTheLibrary(t *testing.T) {
	tok := loadModel(t, "qwen3", Config{})
	rep := func(id uint32, n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = id
		}
		return out
	}
	pairs := func(n int) []uint32 {
		var out []uint32
		for range n {
			out = append(out, 136, 244)
		}
		return out
	}
	cases := []struct {
		name, text string
		want       []uint32
	}{
		// The library reorders each run (U+0316, class 220, before U+0301, 230).
		{"x + 16×(U+0316 U+0301)", "x" + strings.Repeat("\u0316\u0301", 16), append(append([]uint32{87}, pairs(16)...), rep(53839, 16)...)},
		{"a + 20×(U+0316 U+0301)", "a" + strings.Repeat("\u0316\u0301", 20), append(append([]uint32{1953}, pairs(20)...), rep(53839, 19)...)},
		{"e + 40×U+0301", "e" + strings.Repeat("\u0301", 40), append([]uint32{963}, rep(53839, 39)...)},
	}
	for _, c := range cases {
		got, err := tok.Encode(c.text, false)
		if assert.NoError(t, err) {
			assert.Equal(t, c.want, got, c.name)
		}
	}
}

// TestUnicodeFormsReorderRunsOfAnyLength: every form reorders and composes a run of
// more than 30 non-starters whole, as UAX #15 without the stream-safe step.
func TestUnicodeFormsReorderRunsOfAnyLength(t *testing.T) {
	acutes := func(n int) string { return strings.Repeat("\u0301", n) }
	tests := []struct {
		name, form, in, want string
	}{
		{"31 marks compose with the starter", "NFC", "e" + acutes(31), "é" + acutes(30)},
		{"a precomposed letter's mark counts", "NFD", "é" + acutes(30), "e" + acutes(31)},
		{"classes sorted across the run", "NFC", "a" + strings.Repeat("\u0301\u0316", 20), "á" + strings.Repeat("\u0316", 20) + acutes(19)},
		{"compatibility decomposition", "NFKC", "ﬁ" + strings.Repeat("\u0316\u0301", 16), "fí" + strings.Repeat("\u0316", 16) + acutes(15)},
		// U+FC5E is a space and two marks under NFKD: 31 non-starters.
		{"a compatibility starter's marks count", "NFKD", "\ufc5e" + strings.Repeat("\u0651", 29), " \u064c" + strings.Repeat("\u0651", 30)},
		{"31 marks without a starter", "NFD", "\u0301\u0316" + acutes(29), "\u0316" + acutes(30)},
		{"a CGJ in the text stays", "NFC", "e" + acutes(32) + "\u034f\u0316\u0301", "é" + acutes(31) + "\u034f\u0316\u0301"},
		{"short runs around a long one", "NFC", "e\u0301 e" + acutes(31) + " o\u0323\u0302", "é é" + acutes(30) + " ộ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUnicodeForm(tt.form)
			got, err := u.normalize(tt.in)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Greater(t, strings.Count(u.form.String(tt.in), cgj), strings.Count(tt.in, cgj), "x/text alone inserts a CGJ: the case tests something")
		})
	}
}

// TestLongSegmentsNormalizeAsXText: longSegment, the path of runs past 30 non-starters,
// gives x/text's result wherever x/text inserts no CGJ: for every character that
// decomposes, has a combining class or combines, alone and among marks and starters it
// may compose or reorder with (Hangul syllables sampled).
func TestLongSegmentsNormalizeAsXText(t *testing.T) {
	contexts := []func(c string) string{
		func(c string) string { return c },
		func(c string) string { return "a" + c + "\u0301" },
		func(c string) string { return c + "\u0316\u0301" },
		func(c string) string { return "\u1100" + c + "\u1161\u11a8" },
		func(c string) string { return "e\u0301\u0323" + c + "\u0300" + c },
		func(c string) string { return norm.NFD.String(c) + "\u0345\u0301\u0b3e" },
	}
	var buf longSegmentBuffers
	for _, name := range []string{"NFC", "NFD", "NFKC", "NFKD"} {
		u := newUnicodeForm(name)
		checked := 0
		for r := rune(0); r <= utf8.MaxRune; r++ {
			p := u.form.PropertiesString(string(r))
			inert := p.Decomposition() == nil && p.CCC() == 0 && p.BoundaryBefore() && p.BoundaryAfter()
			if inert || isHangulSyllable(r) && r%97 != 0 || r >= 0xd800 && r <= 0xdfff {
				continue
			}
			for _, f := range contexts {
				s := f(string(r))
				want := u.form.String(s)
				if strings.Contains(want, cgj) {
					continue
				}
				var b strings.Builder
				u.longSegment(&b, s, &buf)
				if b.String() != want {
					t.Fatalf("%s %+q: got %+q, x/text %+q", name, s, b.String(), want)
				}
				checked++
			}
		}
		assert.Greater(t, checked, 10000, name)
	}
}

// TestIsNumericFollowsRust: the reference's Rust std already has Unicode 17 (the probe
// found no difference), so the digits added in 17 are numeric to both.
func TestIsNumericFollowsRust(t *testing.T) {
	for r := rune(0x11DE0); r <= 0x11DE9; r++ {
		assert.True(t, isNumeric(r))
	}
	assert.True(t, isNumeric('7'))
	assert.True(t, isNumeric('½'))
	assert.False(t, isNumeric('x'))
}
