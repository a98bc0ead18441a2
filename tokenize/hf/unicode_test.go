package hf

import (
	"testing"

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
