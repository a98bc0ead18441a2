package template

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The Jinja library's tojson builds its whole output before anything can look at its
// size, and a template that pretty-prints a client's value (Llama 3.1's
// `tools | tojson(indent=4)`) amplifies it: each leaf of arrays nested 124 deep prints
// on its own line behind ~500 spaces, so a 256 KiB body became a 66 MB prompt and
// 508 MiB of allocation before MaxOutputBytes could refuse it. The library looks its
// own filters up before the template's variables, so a variable cannot replace them;
// instead compile renames every application of tojson in a tag (`x | tojson(…)`,
// `{% filter tojson %}`, `x | map('tojson', …)`) to one of the names below, which each
// render binds to a filter that charges its output to the render's budget (the
// renderer's MaxOutputBytes) and refuses, before allocating it, an output the budget
// cannot hold. Its output is the library's byte for byte (TestTojsonMatchesTheLibrary,
// FuzzTojson). `{% raw %}` blocks and string literals are left alone; the one way left
// to reach the library's own tojson is map() given the filter's name other than as a
// literal, which no known template does.
const (
	tojsonFilter    = "__kvroute_tojson"
	mapTojsonFilter = "__kvroute_map_tojson"
)

// trimFilter is the name compile gives every application of the trim filter, bound to
// pyTrim: the library's trim is Go's strings.TrimSpace, but Jinja2's is Python's
// str.strip(), which also strips U+001C–U+001F, so a message ending in one of them (the
// Llama 3.x, Llama 4, Gemma and Nemotron templates trim every message) rendered other
// text than the engine's.
const trimFilter = "__kvroute_trim"

// bindTojson returns the body src[start:end] of a tag (its tokens toks; block for a
// {% %} tag) with every application of tojson renamed: the filter name after "|" (or
// first in a filter block) becomes tojsonFilter, and map('tojson', …) becomes
// mapTojsonFilter(…) unless map has an attribute= argument (which ignores the filter).
// The trim filter is renamed trimFilter the same way.
func bindTojson(src string, start, end int, toks []token, block bool) string {
	var out strings.Builder
	pos := start
	for k, t := range toks {
		if t.kind != tokName || t.at < pos || !filterPosition(toks, k, block) {
			continue
		}
		var to int
		var name string
		switch t.text {
		case "tojson":
			to, name = t.end, tojsonFilter
		case "trim":
			to, name = t.end, trimFilter
		case "map":
			n, ok := mapTojsonEnd(src, toks, k)
			if !ok {
				continue
			}
			to, name = n, mapTojsonFilter+"("
		default:
			continue
		}
		if out.Len() == 0 {
			out.Grow(end - start + 32)
		}
		out.WriteString(src[pos:t.at])
		out.WriteString(name)
		pos = to
	}
	if pos == start {
		return src[start:end]
	}
	out.WriteString(src[pos:end])
	return out.String()
}

// filterPosition reports whether the name toks[k] names a filter: it follows "|", or it
// is the first name of a filter block, and is not followed by ".".
func filterPosition(toks []token, k int, block bool) bool {
	if k+1 < len(toks) && toks[k+1].kind == tokOp && toks[k+1].text == "." {
		return false
	}
	if k > 0 && toks[k-1].kind == tokOp && toks[k-1].text == "|" {
		return true
	}
	return block && k == 1 && toks[0].kind == tokName && toks[0].text == "filter"
}

// mapTojsonEnd reads map('tojson' followed by "," or ")" at toks[k] and returns the
// offset where mapTojsonFilter's arguments start (after the comma, or at the ")").
// The library's map applies no filter when given attribute=, so that call is left as is.
func mapTojsonEnd(src string, toks []token, k int) (int, bool) {
	if k+3 >= len(toks) || toks[k+1].kind != tokOp || toks[k+1].text != "(" {
		return 0, false
	}
	name := toks[k+2]
	if name.kind != tokString || src[name.at+1:name.end-1] != "tojson" {
		return 0, false
	}
	c := closing(toks, k+1)
	if c < 0 {
		return 0, false
	}
	depth := 0
	for j := k + 2; j < c; j++ {
		switch t := toks[j]; {
		case t.kind == tokOp && (t.text == "(" || t.text == "[" || t.text == "{"):
			depth++
		case t.kind == tokOp && (t.text == ")" || t.text == "]" || t.text == "}"):
			depth--
		case depth == 0 && t.kind == tokName && t.text == "attribute" && toks[j+1].kind == tokOp && toks[j+1].text == "=":
			return 0, false
		}
	}
	switch next := toks[k+3]; {
	case next.kind == tokOp && next.text == ",":
		return next.end, true
	case next.kind == tokOp && next.text == ")":
		return name.end, true
	}
	return 0, false
}

// jsonBudget is what one render's tojson calls may still print in total.
type jsonBudget struct {
	left int
	// exceeded is set when a call was refused; need is the size it asked for.
	exceeded bool
	need     int
}

// errTojsonBudget ends a render whose tojson output would exceed its budget; the
// renderer reports it as ErrOutputTooLarge.
var errTojsonBudget = errors.New("tojson output over the render's budget")

// bind sets the render's bounded tojson filters among the template variables.
func (b *jsonBudget) bind(data map[string]jinja.Value) {
	data[tojsonFilter] = jinja.NewCallable("tojson", b.tojson)
	data[mapTojsonFilter] = jinja.NewCallable("map", b.mapTojson)
	data[trimFilter] = trimValue
}

// trimValue is the filter trimFilter names, the same for every render.
var trimValue = jinja.NewCallable("trim", pyTrim)

// pyTrim is Jinja2's trim filter, soft_str(value).strip(chars): Python's strip without
// characters strips what str.isspace() holds (pyStrip), with them any of them. A value
// that is not a string prints as the library's trim prints it.
func pyTrim(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	s := filterText(args[0])
	if len(args) > 1 {
		return jinja.NewString(strings.Trim(s, filterText(args[1]))), nil
	}
	return jinja.NewString(pyStrip(s)), nil
}

// filterText is a value as the library's string filters read it: a string as is,
// undefined and callables empty, anything else as it prints.
func filterText(v jinja.Value) string {
	switch {
	case v.IsString():
		return v.AsString()
	case v.IsUndefined(), v.IsCallable():
		return ""
	}
	return v.String()
}

// tojson is transformers' tojson filter as the library implements it (arguments
// ensure_ascii, indent, separators, sort_keys, by position or keyword), its output
// charged to the budget: an output the budget cannot hold is refused before it is
// built.
func (b *jsonBudget) tojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	v := args[0]
	o, err := tojsonOptions(args, kwargs)
	if err != nil {
		// The library reports a cycle before its arguments.
		if cyclic(v, nil) {
			return jinja.Undefined(), errTojsonCycle
		}
		return jinja.Undefined(), err
	}
	size := jsonWriter{opts: &o}
	if err := size.value(v, 0, nil); err != nil {
		return jinja.Undefined(), err
	}
	need := size.n
	if o.ensureASCII {
		need = size.ascii
	}
	if need > b.left {
		b.exceeded, b.need = true, need
		return jinja.Undefined(), fmt.Errorf("%w: %d bytes, %d left", errTojsonBudget, need, b.left)
	}
	var sb strings.Builder
	sb.Grow(size.n)
	w := jsonWriter{opts: &o, sb: &sb}
	_ = w.value(v, 0, nil) // the sizing pass found no cycle
	out := sb.String()
	if o.ensureASCII {
		out = asciiEscape(out, size.ascii)
	}
	b.left -= len(out)
	return jinja.NewString(out), nil
}

// mapTojson is the library's map('tojson', …): the bounded tojson applied to each item
// (a list's items, a dict's keys, a string's characters; none of anything else).
func (b *jsonBudget) mapTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewList(nil), nil
	}
	var src []jinja.Value
	switch v := args[0]; {
	case v.IsList():
		src = v.AsList().Items
	case v.IsDict():
		for _, key := range v.AsDict().Keys {
			src = append(src, jinja.NewString(key))
		}
	case v.IsString():
		for _, r := range v.AsString() {
			src = append(src, jinja.NewString(string(r)))
		}
	}
	items := make([]jinja.Value, len(src))
	callArgs := make([]jinja.Value, len(args))
	copy(callArgs[1:], args[1:])
	for i, item := range src {
		callArgs[0] = item
		v, err := b.tojson(callArgs, kwargs)
		if err != nil {
			return jinja.Undefined(), err
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

var (
	errTojsonCycle      = errors.New("tojson: circular reference detected")
	errTojsonSeparators = errors.New("tojson: separators must contain two strings")
)

// jsonOptions are a tojson call's arguments.
type jsonOptions struct {
	itemSep, keySep string
	// indented: newlines and indentation, each level padString or padSpaces spaces.
	indented      bool
	padString     string
	padSpaces     int
	isPadString   bool
	sortKeys      bool
	ensureASCII   bool
	padLen, padLA int // one level's length, plain and ASCII-escaped
	itemLA, keyLA int // the separators' ASCII-escaped lengths
}

// tojsonOptions reads a call's arguments as the library's filterTojson does.
func tojsonOptions(args []jinja.Value, kwargs map[string]jinja.Value) (jsonOptions, error) {
	o := jsonOptions{itemSep: ", ", keySep: ": "}
	if indent := argument(args, kwargs, 2, "indent", jinja.None()); !indent.IsNone() && !indent.IsUndefined() {
		o.indented, o.itemSep = true, ","
		if indent.IsString() {
			o.isPadString, o.padString = true, indent.AsString()
			o.padLen, o.padLA = len(o.padString), asciiLen(o.padString)
		} else {
			o.padSpaces = max(0, int(toInt64(indent)))
			o.padLen, o.padLA = o.padSpaces, o.padSpaces
		}
	}
	if seps := argument(args, kwargs, 3, "separators", jinja.None()); !seps.IsNone() {
		if !seps.IsList() || seps.AsList().Len() != 2 {
			return o, errTojsonSeparators
		}
		items := seps.AsList().Items
		if !items[0].IsString() || !items[1].IsString() {
			return o, errTojsonSeparators
		}
		o.itemSep, o.keySep = items[0].AsString(), items[1].AsString()
	}
	o.itemLA, o.keyLA = asciiLen(o.itemSep), asciiLen(o.keySep)
	o.sortKeys = argument(args, kwargs, 4, "sort_keys", jinja.NewBool(false)).IsTruthy()
	o.ensureASCII = argument(args, kwargs, 1, "ensure_ascii", jinja.NewBool(false)).IsTruthy()
	return o, nil
}

// argument is a filter argument given by keyword, else by position, else fallback.
func argument(args []jinja.Value, kwargs map[string]jinja.Value, index int, name string, fallback jinja.Value) jinja.Value {
	if v, ok := kwargs[name]; ok {
		return v
	}
	if len(args) > index {
		return args[index]
	}
	return fallback
}

// toInt64 is the library's integer conversion of a non-string indent.
func toInt64(v jinja.Value) int64 {
	switch {
	case v.IsInt():
		return v.AsInt()
	case v.IsFloat():
		return int64(v.AsFloat())
	case v.IsBool() && v.AsBool():
		return 1
	}
	return 0
}

// cyclic reports whether a container holds one of its ancestors.
func cyclic(v jinja.Value, ancestors []any) bool {
	switch {
	case v.IsList():
		l := v.AsList()
		if slices.Contains(ancestors, any(l)) {
			return true
		}
		for _, it := range l.Items {
			if cyclic(it, append(ancestors, l)) {
				return true
			}
		}
	case v.IsDict():
		d := v.AsDict()
		if slices.Contains(ancestors, any(d)) {
			return true
		}
		for _, key := range d.Keys {
			if cyclic(d.Data[key], append(ancestors, d)) {
				return true
			}
		}
	}
	return false
}

// jsonWriter encodes a value as the library's encodeValueJSON does into sb, or, with sb
// nil, only measures the encoding: n bytes, and ascii bytes once ensure_ascii escapes
// them (exact unless a separator or the indent string holds invalid UTF-8, which the
// count takes at its largest). The counts saturate at math.MaxInt.
type jsonWriter struct {
	opts     *jsonOptions
	sb       *strings.Builder
	n, ascii int
}

func (w *jsonWriter) add(n, ascii int) {
	w.n, w.ascii = satAdd(w.n, n), satAdd(w.ascii, ascii)
}

func satAdd(a, b int) int {
	if b > math.MaxInt-a {
		return math.MaxInt
	}
	return a + b
}

func satMul(a, b int) int {
	if a != 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

// lit writes s, which is ASCII.
func (w *jsonWriter) lit(s string) {
	if w.sb != nil {
		w.sb.WriteString(s)
		return
	}
	w.add(len(s), len(s))
}

// sep writes a separator.
func (w *jsonWriter) sep(s string, asciiLen int) {
	if w.sb != nil {
		w.sb.WriteString(s)
		return
	}
	w.add(len(s), asciiLen)
}

const spaces = "                                                                "

// newline writes a newline and level levels of indentation, when indenting.
func (w *jsonWriter) newline(level int) {
	o := w.opts
	if !o.indented {
		return
	}
	if w.sb == nil {
		w.add(1, 1)
		w.add(satMul(level, o.padLen), satMul(level, o.padLA))
		return
	}
	w.sb.WriteByte('\n')
	if o.isPadString {
		for range level {
			w.sb.WriteString(o.padString)
		}
		return
	}
	for n := level * o.padSpaces; n > 0; n -= len(spaces) {
		w.sb.WriteString(spaces[:min(n, len(spaces))])
	}
}

// value writes v at depth; ancestors are the containers above it while measuring.
func (w *jsonWriter) value(v jinja.Value, depth int, ancestors []any) error {
	switch {
	case v.IsBool() && v.AsBool():
		w.lit("true")
	case v.IsBool():
		w.lit("false")
	case v.IsInt():
		var buf [20]byte
		w.num(strconv.AppendInt(buf[:0], v.AsInt(), 10))
	case v.IsFloat():
		var buf [32]byte
		w.num(appendJSONFloat(buf[:0], v.AsFloat()))
	case v.IsString():
		w.str(v.AsString())
	case v.IsList():
		l := v.AsList()
		if w.sb == nil {
			if slices.Contains(ancestors, any(l)) {
				return errTojsonCycle
			}
			ancestors = append(ancestors, l)
		}
		w.lit("[")
		for i, it := range l.Items {
			if i > 0 {
				w.sep(w.opts.itemSep, w.opts.itemLA)
			}
			w.newline(depth + 1)
			if err := w.value(it, depth+1, ancestors); err != nil {
				return err
			}
		}
		if len(l.Items) > 0 {
			w.newline(depth)
		}
		w.lit("]")
	case v.IsDict():
		d := v.AsDict()
		if w.sb == nil {
			if slices.Contains(ancestors, any(d)) {
				return errTojsonCycle
			}
			ancestors = append(ancestors, d)
		}
		keys := d.Keys
		if w.opts.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys)
		}
		w.lit("{")
		for i, key := range keys {
			if i > 0 {
				w.sep(w.opts.itemSep, w.opts.itemLA)
			}
			w.newline(depth + 1)
			w.str(key)
			w.sep(w.opts.keySep, w.opts.keyLA)
			if err := w.value(d.Data[key], depth+1, ancestors); err != nil {
				return err
			}
		}
		if len(keys) > 0 {
			w.newline(depth)
		}
		w.lit("}")
	default: // undefined, none, a callable
		w.lit("null")
	}
	return nil
}

// num writes a number's ASCII text.
func (w *jsonWriter) num(b []byte) {
	if w.sb != nil {
		w.sb.Write(b)
		return
	}
	w.add(len(b), len(b))
}

// appendJSONFloat appends a float as the library's tojson writes it: NaN, Infinity,
// -Infinity, else Python's repr.
func appendJSONFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "Infinity"...)
	case math.IsInf(f, -1):
		return append(b, "-Infinity"...)
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-4 || a >= 1e16) {
		format = 'e'
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	for _, c := range b[start:] {
		if c == '.' || c == 'e' {
			return b
		}
	}
	return append(b, ".0"...)
}

const hexDigits = "0123456789abcdef"

// str writes s as a JSON string: '"' and '\\' and the control characters escaped, the
// rest as is (invalid UTF-8 becoming U+FFFD), as the library's encodeJSONString.
func (w *jsonWriter) str(s string) {
	if w.sb == nil {
		n, ascii := 2, 2
		for _, r := range s {
			switch {
			case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
				n, ascii = n+2, ascii+2
			case r < 0x20:
				n, ascii = n+6, ascii+6
			default:
				n, ascii = n+utf8.RuneLen(r), ascii+asciiRuneLen(r)
			}
		}
		w.add(n, ascii)
		return
	}
	sb := w.sb
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		default:
			if r < 0x20 {
				sb.WriteString(`\u00`)
				sb.WriteByte(hexDigits[r>>4])
				sb.WriteByte(hexDigits[r&0xf])
			} else {
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

// asciiRuneLen is the length of r once ensure_ascii has escaped it.
func asciiRuneLen(r rune) int {
	switch {
	case r < 127:
		return 1
	case r <= 0xffff:
		return 6
	}
	return 12
}

// asciiLen is the length of s once ensure_ascii has escaped it (invalid UTF-8 counting
// as U+FFFD, each byte).
func asciiLen(s string) int {
	n := 0
	for _, r := range s {
		n += asciiRuneLen(r)
	}
	return n
}

// asciiEscape is the library's ensure_ascii pass: every rune from U+007F on written as
// \uXXXX (a UTF-16 surrogate pair above U+FFFF). size is the output's length or more.
func asciiEscape(s string, size int) string {
	var b strings.Builder
	b.Grow(size)
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hexDigits[r>>12&0xf])
		b.WriteByte(hexDigits[r>>8&0xf])
		b.WriteByte(hexDigits[r>>4&0xf])
		b.WriteByte(hexDigits[r&0xf])
	}
	for _, r := range s {
		switch {
		case r < 127:
			b.WriteByte(byte(r))
		case r <= 0xffff:
			u(r)
		default:
			r -= 0x10000
			u(0xd800 + r>>10)
			u(0xdc00 + r&0x3ff)
		}
	}
	return b.String()
}
