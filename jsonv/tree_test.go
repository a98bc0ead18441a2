package jsonv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referenceValue is Value as it was before the two-pass materialiser: one pass through
// Members, Elements and str, appending to growing slices, deduping keys by a scan up to
// linearKeys members and a map beyond. The differential tests hold Value to it.
func referenceValue(d *Decoder) (Value, error) {
	k, err := d.Peek()
	if err != nil {
		return Value{}, err
	}
	switch k {
	case Object:
		var items []Value
		var seen map[string]int
		err := d.Members(func(key string) error {
			v, err := referenceValue(d)
			if err != nil {
				return err
			}
			at, dup := -1, false
			if seen == nil && len(items)/2 < linearKeys {
				for i := 0; i < len(items); i += 2 {
					if items[i].Str() == key {
						at, dup = i, true
						break
					}
				}
			} else {
				if seen == nil {
					seen = make(map[string]int, len(items))
					for i := 0; i < len(items); i += 2 {
						seen[items[i].Str()] = i
					}
				}
				if at, dup = seen[key]; !dup {
					seen[key] = len(items)
				}
			}
			if dup {
				items[at+1] = v
				return nil
			}
			items = append(items, StringValue(key), v)
			return nil
		})
		return containerValue(Object, items), err
	case Array:
		var items []Value
		err := d.Elements(func(int) error {
			v, err := referenceValue(d)
			items = append(items, v)
			return err
		})
		return containerValue(Array, items), err
	case String:
		s, err := d.str()
		return StringValue(s), err
	case Number:
		lit, err := d.number()
		return textValue(Number, string(lit)), err
	}
	return Value{kind: k}, d.literal(k)
}

// sameTree reports where two values differ ("" when they do not), reading them only
// through the exported accessors.
func sameTree(a, b Value, path string) string {
	if a.Kind() != b.Kind() || a.Str() != b.Str() || a.Len() != b.Len() {
		return fmt.Sprintf("%s: %s %q (%d) against %s %q (%d)", path, a.Kind(), a.Str(), a.Len(), b.Kind(), b.Str(), b.Len())
	}
	switch a.Kind() {
	case Array:
		for i := range a.Len() {
			if diff := sameTree(a.Items()[i], b.Items()[i], fmt.Sprintf("%s[%d]", path, i)); diff != "" {
				return diff
			}
		}
	case Object:
		for i := range a.Len() {
			ka, va := a.Member(i)
			kb, vb := b.Member(i)
			if ka != kb {
				return fmt.Sprintf("%s: member %d named %q against %q", path, i, ka, kb)
			}
			if diff := sameTree(va, vb, path+"."+ka); diff != "" {
				return diff
			}
		}
	}
	return ""
}

// randomDocument writes a JSON value of random shape: nested arrays and objects (some
// over linearKeys members, with names drawn from a few so that they repeat), strings
// of plain, escaped, multi-byte and invalid text, numbers and literals, with random
// white space.
func randomDocument(rng *rand.Rand, b *strings.Builder, depth int) {
	space := func() {
		if rng.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n  "}[rng.IntN(4)])
		}
	}
	pieces := []string{"a", "role", "content", "é", "🚀", `\n`, `\"`, `\\`, `\u00e9`, `\ud83d\ude80`, `\ud800`, "\xff", "\x01", "0123456789abcdef"}
	str := func() {
		b.WriteByte('"')
		for n := rng.IntN(4); n > 0; n-- {
			p := pieces[rng.IntN(len(pieces))]
			if (p == "\xff" || p == "\x01") && rng.IntN(20) != 0 {
				p = "x" // invalid bytes, now and then
			}
			b.WriteString(p)
		}
		b.WriteByte('"')
	}
	space()
	kind := rng.IntN(8)
	if depth > 4 || depth > 1 && rng.IntN(2) == 0 {
		kind = rng.IntN(3) // a scalar
	}
	switch kind {
	case 0:
		str()
	case 1:
		b.WriteString([]string{"0", "-1", "12.5e-3", "1E400", "12345678901234567890", "7"}[rng.IntN(6)])
	case 2:
		b.WriteString([]string{"true", "false", "null"}[rng.IntN(3)])
	case 3, 4, 5:
		b.WriteByte('[')
		n := rng.IntN(6)
		if depth < 2 && rng.IntN(8) == 0 {
			n = rng.IntN(300)
		}
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			randomDocument(rng, b, depth+1)
		}
		space()
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		n := rng.IntN(6)
		if depth < 2 && rng.IntN(6) == 0 {
			n = linearKeys - 2 + rng.IntN(40)
		}
		names := 1 + rng.IntN(2*n+1)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			if rng.IntN(10) == 0 {
				str()
			} else {
				fmt.Fprintf(b, `"k%d"`, rng.IntN(names))
			}
			space()
			b.WriteByte(':')
			randomDocument(rng, b, depth+1)
		}
		space()
		b.WriteByte('}')
	}
	space()
}

// TestValueMatchesTheOnePassReader holds the two-pass Value to the one-pass reader it
// replaced on seeded random documents, whole and damaged (cut short, or a byte
// replaced by one that breaks or changes the syntax): the same tree, the same position
// after it, and the same error at the same offset, under random depth limits.
func TestValueMatchesTheOnePassReader(t *testing.T) {
	rng := rand.New(rand.NewPCG(80, 1))
	damage := []byte{'[', ']', '{', '}', ',', ':', '"', '\\', '0', '-', 'e', ' ', 'x', 0x01, 0xc3}
	for i := range 5_000 {
		var b strings.Builder
		randomDocument(rng, &b, 0)
		doc := []byte(b.String())
		switch rng.IntN(4) {
		case 0:
			doc = doc[:rng.IntN(len(doc)+1)]
		case 1:
			if len(doc) > 0 {
				doc[rng.IntN(len(doc))] = damage[rng.IntN(len(damage))]
			}
		}
		doc = append(doc, " ,1"...) // something after the value, as in a request body
		depth := 1 + rng.IntN(8)

		want, wantErr := referenceValue(NewDecoder(doc, depth))
		d := NewDecoder(doc, depth)
		got, err := d.Value()
		ref := NewDecoder(doc, depth)
		_, _ = referenceValue(ref)
		if wantErr != nil {
			require.Error(t, err, "case %d: %q", i, doc)
			require.Equal(t, wantErr.Error(), err.Error(), "case %d: %q", i, doc)
			require.Equal(t, errors.Is(wantErr, ErrTooDeep), errors.Is(err, ErrTooDeep), "case %d", i)
			continue
		}
		require.NoError(t, err, "case %d: %q", i, doc)
		require.Empty(t, sameTree(want, got, "$"), "case %d: %q", i, doc)
		require.Equal(t, ref.pos, d.pos, "case %d: position after the value", i)
		require.Equal(t, ref.depth, d.depth, "case %d: depth after the value", i)
	}
}

// TestValueBudget pins the budget: a value that would pass it is consumed, its syntax
// checked, nothing taken from the budget; the values that fit are read as without one.
func TestValueBudget(t *testing.T) {
	doc := []byte(`{"small":["ab",1],"big":[0,0,0,0,0,0,0,0],"bad":[0,0,0,0,0,0,0,0,0,"` + "\x01" + `"],"after":"cd"}`)
	const small = 2*valueSize + len("ab") + len("1") // two elements and their texts
	d := NewDecoder(doc, 8)
	d.SetValueBudget(small + 8*valueSize - 1 + len("cd"))
	got := map[string]error{}
	var values []string
	err := d.Members(func(key string) error {
		v, err := d.Value()
		if errors.Is(err, ErrOverBudget) {
			got[key] = err
			return nil
		}
		if err == nil {
			values = append(values, key+"="+string(v.AppendCompact(nil)))
		}
		return err
	})
	require.Error(t, err, "a syntax error past the budget is still found")
	assert.Contains(t, err.Error(), "control character in a string")
	assert.ErrorIs(t, got["big"], ErrOverBudget)
	assert.Equal(t, []string{`small=["ab",1]`}, values)

	d = NewDecoder([]byte(string(doc[:strings.Index(string(doc), `,"bad"`)])+`,"after":"cd"}`), 8)
	d.SetValueBudget(small + 8*valueSize - 1 + len("cd"))
	values = values[:0]
	require.NoError(t, d.Members(func(key string) error {
		v, err := d.Value()
		if errors.Is(err, ErrOverBudget) {
			values = append(values, key+" over budget")
			return nil
		}
		values = append(values, key+"="+string(v.AppendCompact(nil)))
		return err
	}))
	assert.Equal(t, []string{`small=["ab",1]`, "big over budget", `after="cd"`}, values,
		"the value over budget took nothing: what is left still holds the last string")
}

// TestScalarIsReadOutsideTheBudget pins Scalar: a string, a number or a literal is
// read whatever is left of the budget, which it leaves as it was, with Value's errors
// (and offsets) for malformed ones; an array or an object is an error naming its kind.
func TestScalarIsReadOutsideTheBudget(t *testing.T) {
	tests := []struct {
		name, doc string
		want      string // the value as JSON
		err       string
	}{
		{"a string", `"meta-llama/Llama-3.1-8B-Instruct"`, `"meta-llama/Llama-3.1-8B-Instruct"`, ""},
		{"an escaped string", `"a\u00e9\n"`, `"aé\n"`, ""},
		{"a number", `100`, `100`, ""},
		{"a literal", `true`, `true`, ""},
		{"null", `null`, `null`, ""},
		{"an array", `[1]`, "", "invalid JSON at byte 0: expected a string, a number, true, false or null, found array"},
		{"an object", `{}`, "", "found object"},
		{"a bad string", "\"a\x01\"", "", "invalid JSON at byte 2: control character in a string"},
		{"a bad number", `1.`, "", "invalid JSON at byte 2: invalid number: no digits after '.'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder([]byte(tt.doc), 8)
			d.SetValueBudget(0)
			v, err := d.Scalar()
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(v.AppendCompact(nil)))
			assert.Zero(t, d.budget, "nothing taken from the budget")
			require.NoError(t, d.End())
		})
	}
}

// treeBytes is what v's tree takes: valueSize per item of its arrays and objects, and
// the bytes of its texts.
func treeBytes(v Value) int {
	n := len(v.Str())
	for _, it := range v.items() {
		n += valueSize + treeBytes(it)
	}
	return n
}

// FuzzValueMatchesTheOnePassReader is TestValueMatchesTheOnePassReader on the fuzzer's
// documents, with a budget: a value Value reads is the one-pass reader's, within the
// budget; one it refuses as over the budget is one the one-pass reader reads whole,
// consumed as far.
func FuzzValueMatchesTheOnePassReader(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}],"c":"\u00e9"}`, `[[],{},[[]]]`, `{"a":1,"a":2,"b":[3],"a":4}`,
		`["\ud800\udc00x\n", "é", 1e5, -0]`, `[0,0,0,0,0,0,0,0]`, `{"k":[` + strings.Repeat(`"ab",`, 40) + `1]}`, `[1,]`, `{"a" 1}`, `"\xff"`} {
		f.Add([]byte(s), uint8(8), uint16(200))
	}
	f.Fuzz(func(t *testing.T, data []byte, depth uint8, budget uint16) {
		maxDepth := 1 + int(depth%16)
		ref := NewDecoder(data, maxDepth)
		want, wantErr := referenceValue(ref)
		d := NewDecoder(data, maxDepth)
		d.SetValueBudget(int(budget))
		got, err := d.Value()
		switch {
		case wantErr != nil:
			require.Error(t, err)
			require.Equal(t, wantErr.Error(), err.Error())
		case errors.Is(err, ErrOverBudget):
			require.Equal(t, ref.pos, d.pos, "consumed as far")
			require.Equal(t, int(budget), d.budget, "nothing taken from the budget")
		default:
			require.NoError(t, err)
			require.Empty(t, sameTree(want, got, "$"))
			require.Equal(t, ref.pos, d.pos)
			require.LessOrEqual(t, treeBytes(got), int(budget))
		}
	})
}

// TestValueMatchesTheOnePassReaderWithNonFinite is TestValueMatchesTheOnePassReader for
// decoders that accept NaN, Infinity and -Infinity, on random documents where some 7s
// (numbers, or digits inside strings) became those words or broken ones.
func TestValueMatchesTheOnePassReaderWithNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 1))
	words := []string{"NaN", "Infinity", "-Infinity", "-NaN", "Infinit", "Na", "I", "nan"}
	decoder := func(doc []byte, depth int) *Decoder {
		d := NewDecoder(doc, depth)
		d.AcceptNonFinite()
		return d
	}
	for i := range 3_000 {
		var b strings.Builder
		randomDocument(rng, &b, 0)
		doc := b.String()
		for strings.Contains(doc, "7") && rng.IntN(3) != 0 {
			w := words[rng.IntN(len(words))]
			if rng.IntN(4) != 0 {
				w = words[rng.IntN(3)]
			}
			doc = strings.Replace(doc, "7", w, 1)
		}
		in := []byte(doc)
		if rng.IntN(4) == 0 {
			in = in[:rng.IntN(len(in)+1)]
		}
		in = append(in, " ,1"...)
		depth := 1 + rng.IntN(8)

		want, wantErr := referenceValue(decoder(in, depth))
		d := decoder(in, depth)
		got, err := d.Value()
		ref := decoder(in, depth)
		_, _ = referenceValue(ref)
		skip := decoder(in, depth)
		skipErr := skip.Skip()
		if wantErr != nil {
			require.Error(t, err, "case %d: %q", i, in)
			require.Equal(t, wantErr.Error(), err.Error(), "case %d: %q", i, in)
			require.Error(t, skipErr, "case %d: %q", i, in)
			require.Equal(t, wantErr.Error(), skipErr.Error(), "case %d: %q", i, in)
			continue
		}
		require.NoError(t, err, "case %d: %q", i, in)
		require.NoError(t, skipErr, "case %d: %q", i, in)
		require.Empty(t, sameTree(want, got, "$"), "case %d: %q", i, in)
		require.Equal(t, ref.pos, d.pos, "case %d: position after the value", i)
		require.Equal(t, ref.pos, skip.pos, "case %d: position after Skip", i)
	}
}
