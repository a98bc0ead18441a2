package jsonv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseKeepsKeyOrderAndPythonDuplicates(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"order kept", `{"b":1,"a":2,"c":{"z":1,"y":2}}`, `{"b":1,"a":2,"c":{"z":1,"y":2}}`},
		{"duplicate keeps first position, last value", `{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`},
		{"number literals kept as written", `[1.0,-0,1e5,12345678901234567890]`, `[1.0,-0,1e5,12345678901234567890]`},
		{"escapes decoded and re-escaped", `"a\u00e9\n\"\/\ud83d\ude00"`, `"aé\n\"/😀"`},
		{"lone surrogate is U+FFFD", `"\ud800x"`, `"` + string(utf8.RuneError) + `x"`},
		{"literals", ` [ true , false , null ] `, `[true,false,null]`},
		{"empty containers", `{"a":[],"b":{}}`, `{"a":[],"b":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse([]byte(tt.in), 8)
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(v.AppendCompact(nil)))
		})
	}
}

func TestDuplicateKeysInLargeObjects(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := range 100 {
		b.WriteString(`"k` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":1,`)
	}
	b.WriteString(`"kaa":2}`)
	v, err := Parse([]byte(b.String()), 4)
	require.NoError(t, err)
	assert.Equal(t, 100, v.Len())
	got, ok := v.Get("kaa")
	require.True(t, ok)
	assert.Equal(t, "2", got.Str())
	key, _ := v.Member(0)
	assert.Equal(t, "kaa", key, "the repeated key keeps its first position")
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, in string
		tooDeep  bool
	}{
		{"empty", ``, false},
		{"trailing data", `{} {}`, false},
		{"trailing comma", `[1,]`, false},
		{"leading zero", `01`, false},
		{"bare minus", `-`, false},
		{"no exponent digits", `1e`, false},
		{"unterminated string", `"abc`, false},
		{"control character", "\"a\x01\"", false},
		{"invalid escape", `"\x"`, false},
		{"short unicode escape", `"\u12"`, false},
		{"invalid UTF-8", "\"\xff\"", false},
		{"single quotes", `{'a':1}`, false},
		{"missing colon", `{"a" 1}`, false},
		{"bad literal", `nul`, false},
		{"deeper than the limit", strings.Repeat("[", 9) + strings.Repeat("]", 9), true},
		{"four million brackets", strings.Repeat("[", 4<<20), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in), 8)
			require.Error(t, err)
			var se *SyntaxError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, tt.tooDeep, errors.Is(err, ErrTooDeep), err.Error())
		})
	}
}

func TestSkipChecksSyntaxAndDepth(t *testing.T) {
	d := NewDecoder([]byte(`{"a":[1,{"b":"\u0041"}],"c":[[[]]]}`), 3)
	err := d.Members(func(string) error { return d.Skip() })
	require.ErrorIs(t, err, ErrTooDeep, "c is nested four levels deep")

	d = NewDecoder([]byte(`{"a":[1,{"b":"x"}],"c":"y"}`), 3)
	var keys []string
	require.NoError(t, d.Members(func(k string) error { keys = append(keys, k); return d.Skip() }))
	require.NoError(t, d.End())
	assert.Equal(t, []string{"a", "c"}, keys)
}

// TestSkipKeepsNothing: Skip is Value's first pass, which keeps nothing: a skipped
// object of many members (an unknown field of a hostile body) costs no allocation, where
// walking it with Members made each member's name a string. Its errors are Value's.
func TestSkipKeepsNothing(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{`)
	for i := range 1000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"key-%d":["x\u00e9",{"k":%d}]`, i, i)
	}
	b.WriteString(`}`)
	body := []byte(b.String())
	allocs := testing.AllocsPerRun(10, func() {
		if err := NewDecoder(body, 8).Skip(); err != nil {
			t.Fatal(err)
		}
	})
	assert.LessOrEqual(t, allocs, 1.0, "the decoder itself at most")
	for _, bad := range []string{`{"a":"\u12"}`, `{"a":"x` + "\x01" + `"}`, `[1,]`, `{"a" 1}`, "\"\xff\""} {
		_, valueErr := NewDecoder([]byte(bad), 8).Value()
		skipErr := NewDecoder([]byte(bad), 8).Skip()
		require.Error(t, skipErr, bad)
		assert.Equal(t, valueErr.Error(), skipErr.Error(), bad)
	}
}

func TestAppendUint32s(t *testing.T) {
	tests := []struct {
		name, in string
		limit    int
		want     []uint32
		wantErr  string
	}{
		{"ids", `[0, 1, 4294967295]`, 10, []uint32{0, 1, 4294967295}, ""},
		{"empty", `[]`, 10, nil, ""},
		{"over the limit", `[1,2,3]`, 2, nil, "more than 2 elements"},
		{"negative", `[1,-1]`, 10, nil, "element 1"},
		{"too large", `[4294967296]`, 10, nil, "element 0"},
		{"fraction", `[1.5]`, 10, nil, "element 0"},
		{"string", `["1"]`, 10, nil, "element 0"},
		{"not an array", `"x"`, 10, nil, "expected an array"},
		// The plain-digits path (plainUint32) and its edges, which go to the general one.
		{"spaces around plain ids", "[ 7 ,\t8\n, 0 ]", 10, []uint32{7, 8, 0}, ""},
		{"the largest ten-digit id", `[4294967295,1]`, 10, []uint32{4294967295, 1}, ""},
		{"ten digits past the range", `[9999999999]`, 10, nil, "element 0"},
		{"eleven digits", `[10000000000]`, 10, nil, "element 0"},
		{"twenty digits", `[18446744073709551616]`, 10, nil, "element 0"},
		{"an exponent", `[1e2]`, 10, nil, "element 0"},
		{"a zero fraction", `[3.0]`, 10, nil, "element 0"},
		{"a leading zero is not JSON", `[01]`, 10, nil, "expected ',' or ']'"},
		{"a lone zero then a digit", `[0,00]`, 10, nil, "expected ',' or ']'"},
		{"a digit run cut short", `[12`, 10, nil, "unexpected end"},
		{"exactly the limit", `[1,2]`, 2, []uint32{1, 2}, ""},
		{"a trailing comma", `[1,]`, 10, nil, "unexpected character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewDecoder([]byte(tt.in), 4).AppendUint32s(nil, tt.limit)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestAppendUint32sFunc: the elements not written as an integer in range go to convert,
// materialised; an integer literal out of range, an array and an object do not.
func TestAppendUint32sFunc(t *testing.T) {
	var seen []string
	convert := func(v Value) (uint32, bool) { // 7 for 7, refuses null and "a…", 70 otherwise
		seen = append(seen, string(v.AppendCompact(nil)))
		if f, ok := v.Float(); ok && f == 7 {
			return 7, true
		}
		return 70, !v.IsNull() && !strings.HasPrefix(v.Str(), "a")
	}
	tests := []struct {
		name, in string
		want     []uint32
		seen     []string
		wantErr  string
	}{
		{"integers stay on the fast path", `[0, 4294967295]`, []uint32{0, 4294967295}, nil, ""},
		{"other forms are converted", `[7.0, 7e0, -0, "x", true, 1]`, []uint32{7, 7, 70, 70, 70, 1}, []string{"7.0", "7e0", "-0", `"x"`, "true"}, ""},
		{"convert refuses", `[1, null]`, nil, []string{"null"}, "element 1: expected an integer in [0, 2^32), got null"},
		{"an integer out of range is not converted", `[4294967296]`, nil, nil, "element 0"},
		{"an array is not converted", `[1, [7]]`, nil, nil, "element 1: expected an integer in [0, 2^32), found array"},
		{"an object is not converted", `[{}]`, nil, nil, "found object"},
		{"a long value is cut in the error", `[false, "` + strings.Repeat("a", 100) + `"]`, nil, []string{"false"}, `got "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen = nil
			got, err := NewDecoder([]byte(tt.in), 4).AppendUint32sFunc(nil, 10, convert)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Less(t, len(err.Error()), 120)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
			}
			if tt.seen != nil {
				assert.Equal(t, tt.seen, seen[:min(len(seen), len(tt.seen))])
			}
		})
	}
}

// TestEveryElementIs reads ahead without consuming: the decoder is where it was, at the
// same depth, whatever the answer.
func TestEveryElementIs(t *testing.T) {
	tests := []struct {
		in      string
		want    bool
		wantErr string
	}{
		{`["a", "b"]`, true, ""},
		{`[]`, true, ""},
		{`["a", 1]`, false, ""},
		{`[1, "a"]`, false, ""},
		{`["a", [["b"]], "c"]`, false, ""},
		{`["a", "b"`, false, "expected ',' or ']' in an array"},
		{`["a" "b"]`, false, "expected ',' or ']' in an array"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			d := NewDecoder([]byte(`{"p":`+tt.in+`}`), 4)
			err := d.Members(func(string) error {
				got, err := d.EveryElementIs(String)
				if tt.wantErr != "" {
					require.Error(t, err)
					assert.Contains(t, err.Error(), tt.wantErr)
				} else {
					require.NoError(t, err)
					assert.Equal(t, tt.want, got)
				}
				k, err := d.Peek()
				require.NoError(t, err)
				assert.Equal(t, Array, k, "nothing consumed")
				return d.Skip()
			})
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NoError(t, d.End())
			}
		})
	}
}

func TestAppendQuotedMatchesPythonJSON(t *testing.T) {
	// json.dumps("é\x7f😀\n<") with ensure_ascii True and False.
	s := "é\x7f😀\n<"
	assert.Equal(t, `"\u00e9\u007f\ud83d\ude00\n<"`, string(AppendQuoted(nil, s, true)))
	assert.Equal(t, "\"é\x7f😀\\n<\"", string(AppendQuoted(nil, s, false)))
}

func TestNumberAccessors(t *testing.T) {
	v, err := Parse([]byte(`[3, 3.0, 1e2, 99999999999999999999]`), 2)
	require.NoError(t, err)
	items := v.Items()
	n, ok := items[0].Int()
	assert.True(t, ok)
	assert.EqualValues(t, 3, n)
	assert.True(t, items[0].IsInteger())
	assert.False(t, items[1].IsInteger())
	assert.False(t, items[2].IsInteger())
	_, ok = items[3].Int()
	assert.False(t, ok, "out of int64 range")
	assert.True(t, items[3].IsInteger())
	f, ok := items[2].Float()
	assert.True(t, ok)
	assert.Equal(t, 100.0, f)
}

// FuzzParse checks Parse against encoding/json: it accepts what encoding/json accepts
// (for valid UTF-8 within the depth limit), rejects what it rejects, and round-trips to
// a document encoding/json reads as the same value.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `[1e5,-0.5,true]`, `"x"`, `{"a":1,"a":2}`, `[[[[]]]]`, `{`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data, 16)
		// Skip is Value's first pass: it refuses what Value refuses, with its error.
		skip := NewDecoder(data, 16)
		skipErr := skip.Skip()
		if skipErr == nil {
			skipErr = skip.End()
		}
		if (err == nil) != (skipErr == nil) || (err != nil && err.Error() != skipErr.Error()) {
			t.Fatalf("Parse: %v; Skip: %v", err, skipErr)
		}
		stdValid := json.Valid(data)
		if err != nil {
			if stdValid && utf8.Valid(data) && !errors.Is(err, ErrTooDeep) {
				t.Fatalf("rejected valid JSON %q: %v", data, err)
			}
			return
		}
		if !stdValid {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		var want, got any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&want))
		out := v.AppendCompact(nil)
		dec = json.NewDecoder(bytes.NewReader(out))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&got), "%s", out)
		assert.Equal(t, want, got)
	})
}

// TestEscapedStringsDecodeWhole pins the escape path, which copies the runs between
// escapes: escapes first, last, adjacent, and between long runs.
func TestEscapedStringsDecodeWhole(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"escape first", `"\nabc"`, "\nabc"},
		{"escape last", `"abc\t"`, "abc\t"},
		{"adjacent escapes", `"a\\\"\/b"`, `a\"/b`},
		{"only escapes", `"\u00e9\u00e9"`, "éé"},
		{"long runs between escapes", `"` + strings.Repeat(`one two three\n`, 500) + `"`, strings.Repeat("one two three\n", 500)},
		{"multi-byte text around an escape", `"héllo\n wörld"`, "héllo\n wörld"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse([]byte(tt.doc), 4)
			require.NoError(t, err)
			assert.Equal(t, tt.want, v.Str())
		})
	}
}

// BenchmarkEscapedString decodes a 16 KiB chat message with a line break every 64 bytes.
func BenchmarkEscapedString(b *testing.B) {
	doc := []byte(`"` + strings.Repeat(strings.Repeat("abc ", 15)+`abc\n`, 256) + `"`)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(doc, 4); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStringsDecodeAsEncodingJSONDoes compares decoded strings with encoding/json's on
// seeded random string literals made of every escape (one-byte, \u, surrogate pairs
// and lone halves), runs of plain ASCII and multi-byte text of every length (so the
// special bytes fall at every offset of the eight-byte words the scanner reads), and
// now and then a raw control character, which both must refuse.
func TestStringsDecodeAsEncodingJSONDoes(t *testing.T) {
	pieces := []string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00e9`, `\u0000`, `\ud83d\ude80`, `\ud800`, `\udc00x`,
		"a", "abcdefg", "0123456789abcdef", "é", "🚀", "'", " ", "<|im_start|>"}
	rng := rand.New(rand.NewPCG(4, 2))
	for i := range 5000 {
		var b strings.Builder
		b.WriteByte('"')
		for n := rng.IntN(40); n > 0; n-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
			if rng.IntN(200) == 0 {
				b.WriteByte(byte(rng.IntN(0x20))) // a raw control character
			}
		}
		b.WriteByte('"')
		doc := b.String()
		var want string
		wantErr := json.Unmarshal([]byte(doc), &want)
		v, err := Parse([]byte(doc), 4)
		require.Equal(t, wantErr == nil, err == nil, "case %d: %q: encoding/json %v, Parse %v", i, doc, wantErr, err)
		if err == nil {
			require.Equal(t, want, v.Str(), "case %d: %q", i, doc)
		}
	}
}

// TestWordScannersAgreeWithByteLoops holds the eight-byte scanners to byte-at-a-time
// loops on seeded random inputs drawn from the bytes their tests confuse: the specials
// (quote, backslash, every control character), their neighbours (0x20, 0x21, 0x23,
// 0x5b, 0x5d, 0x7f) and bytes ≥ 0x80, which a borrow or a sign must not turn into or
// hide a special, at every offset of a word and with a backslash last.
func TestWordScannersAgreeWithByteLoops(t *testing.T) {
	alphabet := []byte{'a', '"', '\\', 0x00, 0x01, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0x81, 0xa2, 0xdc, 0xff}
	plain := func(b []byte) int {
		for p, c := range b {
			if c == '"' || c == '\\' || c < 0x20 {
				return p
			}
		}
		return len(b)
	}
	raw := func(b []byte) int {
		for p := 0; p < len(b); p++ {
			switch b[p] {
			case '"':
				return p
			case '\\':
				p++
			}
		}
		return len(b)
	}
	rng := rand.New(rand.NewPCG(5, 8))
	for i := range 200_000 {
		b := make([]byte, rng.IntN(26))
		for j := range b {
			b[j] = 'a'
			if rng.IntN(3) == 0 {
				b[j] = alphabet[rng.IntN(len(alphabet))]
			}
		}
		require.Equal(t, plain(b), plainRun(b), "case %d: plainRun(%q)", i, b)
		require.Equal(t, raw(b), rawLength(b), "case %d: rawLength(%q)", i, b)
	}
}

// TestTruthyIsPythons: a value's Truthy is bool() of what Python's json.loads makes of
// it (vLLM's conditions read values so).
func TestTruthyIsPythons(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{`null`, false}, {`false`, false}, {`true`, true},
		{`0`, false}, {`-0`, false}, {`0.0`, false}, {`0e5`, false}, {`1`, true}, {`-0.5`, true}, {`1e400`, true},
		{`""`, false}, {`" "`, true}, {`"0"`, true},
		{`[]`, false}, {`[null]`, true}, {`{}`, false}, {`{"a":null}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			v, err := Parse([]byte(tt.in), 8)
			require.NoError(t, err)
			assert.Equal(t, tt.want, v.Truthy())
		})
	}
	assert.False(t, Value{}.Truthy(), "absent")
}

func TestSkipByteOrderMark(t *testing.T) {
	const bom = "\xef\xbb\xbf"
	d := NewDecoder([]byte(bom+` {"a":1}`), 8)
	d.SkipByteOrderMark()
	assert.Equal(t, 3, d.Offset(), "offsets stay the input's")
	v, err := d.Value()
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, string(v.AppendCompact(nil)))
	require.NoError(t, d.End())

	// Only one mark, and only at the very start.
	for _, in := range []string{bom + bom + `{}`, ` ` + bom + `{}`, `{}` + bom, bom} {
		d := NewDecoder([]byte(in), 8)
		d.SkipByteOrderMark()
		_, err := d.Value()
		if err == nil {
			err = d.End()
		}
		assert.Error(t, err, "%q", in)
	}
	// Without the call, a mark is an unexpected character, as to encoding/json.
	_, err = Parse([]byte(bom+`{}`), 8)
	assert.Error(t, err)
}

func TestAcceptNonFinite(t *testing.T) {
	in := `{"a":NaN,"b":[Infinity,-Infinity,1],"c":{"d":NaN},"a":-Infinity}`
	_, err := Parse([]byte(in), 8)
	require.Error(t, err, "RFC 8259 alone without the call")

	d := NewDecoder([]byte(in), 8)
	d.AcceptNonFinite()
	v, err := d.Value()
	require.NoError(t, err)
	require.NoError(t, d.End())
	assert.Equal(t, `{"a":-Infinity,"b":[Infinity,-Infinity,1],"c":{"d":NaN}}`, string(v.AppendCompact(nil)))
	b, _ := v.Get("b")
	for i, want := range []float64{math.Inf(1), math.Inf(-1)} {
		n := b.Items()[i]
		f, ok := n.Float()
		assert.True(t, ok)
		assert.Equal(t, want, f)
		_, isInt := n.Int()
		assert.False(t, isInt)
		assert.False(t, n.IsInteger())
		assert.True(t, n.Truthy(), "bool(inf) is True")
	}
	c, _ := v.Get("c")
	nan, _ := c.Get("d")
	f, ok := nan.Float()
	assert.True(t, ok)
	assert.True(t, math.IsNaN(f))
	assert.False(t, nan.IsInteger())
	assert.True(t, nan.Truthy(), "bool(nan) is True")

	// Skip, Scalar and the one-pass reader take them too.
	d = NewDecoder([]byte(in), 8)
	d.AcceptNonFinite()
	require.NoError(t, d.Skip())
	d = NewDecoder([]byte(`[NaN, -Infinity]`), 8)
	d.AcceptNonFinite()
	var lits []string
	require.NoError(t, d.Elements(func(int) error {
		s, err := d.Scalar()
		lits = append(lits, s.Str())
		return err
	}))
	assert.Equal(t, []string{"NaN", "-Infinity"}, lits)

	// Python's three spellings alone.
	for _, bad := range []string{`nan`, `Inf`, `inf`, `infinity`, `+Infinity`, `-NaN`, `NaNa`, `Infinit`, `-I`, `-`, `N`, `[NaN,]`} {
		for _, skip := range []bool{false, true} {
			d := NewDecoder([]byte(bad), 8)
			d.AcceptNonFinite()
			if skip {
				err = d.Skip()
			} else {
				_, err = d.Value()
			}
			if err == nil {
				err = d.End()
			}
			assert.Error(t, err, "%q", bad)
		}
	}

	// Not token ids.
	d = NewDecoder([]byte(`[1,NaN]`), 8)
	d.AcceptNonFinite()
	_, err = d.AppendUint32sFunc(nil, 8, func(v Value) (uint32, bool) { return 0, v.IsInteger() })
	assert.ErrorContains(t, err, "element 1")
}

func TestIsIntegerIsDigitsAfterAnOptionalMinus(t *testing.T) {
	for lit, want := range map[string]bool{"0": true, "-0": true, "123": true, "-12": true, "1.0": false, "1e2": false, "1E2": false, "NaN": false, "Infinity": false, "-Infinity": false} {
		d := NewDecoder([]byte(lit), 1)
		d.AcceptNonFinite()
		v, err := d.Value()
		require.NoError(t, err, lit)
		assert.Equal(t, want, v.IsInteger(), lit)
	}
}

// TestAppendUint32sConsumesTheWholeArray: after an element error, or past the limit, the
// rest of the array is skipped (its syntax checked), so the document can be read on; a
// syntax error anywhere in the array is the error.
func TestAppendUint32sConsumesTheWholeArray(t *testing.T) {
	tests := []struct {
		name, in string
		sentinel error
		msg      string
	}{
		{"a negative element", `{"p":[1,-1,[2,{"a":3}],"x"],"q":7}`, ErrNotUint32, "element 1"},
		{"an array element", `{"p":[[1],2],"q":7}`, ErrNotUint32, "element 0"},
		{"convert refuses", `{"p":[1,null,2],"q":7}`, ErrNotUint32, "element 1"},
		{"over the limit", `{"p":[1,2,3,4,[5]],"q":7}`, ErrTooMany, "more than 2 elements"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder([]byte(tt.in), 4)
			var errP error
			var q Value
			err := d.Members(func(key string) error {
				if key == "q" {
					var err error
					q, err = d.Value()
					return err
				}
				_, errP = d.AppendUint32sFunc(nil, 2, func(v Value) (uint32, bool) { return 0, v.Kind() == String })
				return nil
			})
			require.NoError(t, err)
			require.NoError(t, d.End())
			require.ErrorIs(t, errP, tt.sentinel)
			assert.Contains(t, errP.Error(), tt.msg)
			assert.Equal(t, "7", q.Str(), "the document is read on past the array")
		})
	}
	// A syntax error after an element error is the error.
	for _, in := range []string{`[-1, 1 2]`, `[-1, x]`, `[1,2,3,]`, `[-1, [[[[[1]]]]]]`, `[-1, "` + "\x01" + `"]`, `[-1,`} {
		_, err := NewDecoder([]byte(in), 4).AppendUint32sFunc(nil, 2, nil)
		require.Error(t, err, in)
		assert.False(t, errors.Is(err, ErrNotUint32) || errors.Is(err, ErrTooMany), "%q: %v", in, err)
	}
}

// TestConvertedElementsBuildNoErrors: an element that is not a number literal goes to
// convert without the error of a failed number being built (two allocations an element,
// where a body of lax ids is nothing but such elements), and Int builds no error for a
// number not written as an integer.
func TestConvertedElementsBuildNoErrors(t *testing.T) {
	in := []byte("[" + strings.Repeat("true,", 999) + "false]")
	dst := make([]uint32, 0, 1000)
	convert := func(v Value) (uint32, bool) {
		if v.Bool() {
			return 1, true
		}
		return 0, true
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := NewDecoder(in, 4).AppendUint32sFunc(dst[:0], 1000, convert); err != nil {
			t.Fatal(err)
		}
	})
	assert.LessOrEqual(t, allocs, 5.0, "allocations for 1,000 converted elements")

	v, err := Parse([]byte(`1.5`), 1)
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(20, func() { _, _ = v.Int() }))
}

// FuzzAppendUint32sMatchesEncodingJSON: AppendUint32s reads an array as encoding/json
// reads it into []uint32, ids and refusals alike (null, which encoding/json takes for
// a nil slice, aside), and refuses more than limit elements with ErrTooMany; the
// fast path for plain ids (appendPlainUint32s) and the general one agree.
func FuzzAppendUint32sMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[ 0 , 4294967295 ]`, `[4294967296]`, `[01]`, `[1e2]`, `[1.0]`, `[-0]`, `[12`, `[]`, `[1,]`, `["1"]`, `[[1]]`, ` [7] `, `[1,2,"3"]`, "[1\t,\n2\r]"} {
		f.Add(s, uint8(255))
		f.Add(s, uint8(2))
	}
	f.Fuzz(func(t *testing.T, in string, limit uint8) {
		if strings.TrimSpace(in) == "null" {
			return
		}
		d := NewDecoder([]byte(in), 4)
		got, err := d.AppendUint32s(nil, int(limit))
		if err == nil {
			err = d.End()
		}
		var want []uint32
		wantErr := json.Unmarshal([]byte(in), &want)
		if wantErr == nil && len(want) > int(limit) {
			if !errors.Is(err, ErrTooMany) {
				t.Fatalf("%q: %d ids past the limit %d, got %v", in, len(want), limit, err)
			}
			return
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: AppendUint32s %v, encoding/json %v", in, err, wantErr)
		}
		if err == nil && !slices.Equal(got, want) {
			t.Fatalf("%q: AppendUint32s %v, encoding/json %v", in, got, want)
		}
	})
}
