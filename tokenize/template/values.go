package template

import (
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/jsonv"
)

// toValue converts a JSON value into a template value as Python's json module decodes
// it: objects keep their key order (tojson must reproduce it), integers stay integers,
// other numbers become floats. Its recursion is bounded by the value's nesting, which
// the request parser limits. Every call builds fresh containers, so a template that
// mutates a value cannot reach another render's.
func toValue(v jsonv.Value) jinja.Value {
	switch v.Kind() {
	case jsonv.False:
		return jinja.NewBool(false)
	case jsonv.True:
		return jinja.NewBool(true)
	case jsonv.Number:
		if n, ok := v.Int(); ok {
			return jinja.NewInt(n)
		}
		f, _ := v.Float()
		return jinja.NewFloat(f)
	case jsonv.String:
		return jinja.NewString(v.Str())
	case jsonv.Array:
		return listValue(v.Items())
	case jsonv.Object:
		d := newDict(v.Len())
		dict := d.AsDict()
		for i := range v.Len() {
			key, val := v.Member(i)
			dict.Set(key, toValue(val))
		}
		return d
	}
	return jinja.None()
}

// newDict returns an empty dict sized for n keys.
func newDict(n int) jinja.Value {
	d := jinja.NewDict()
	dict := d.AsDict()
	dict.Keys = make([]string, 0, n)
	dict.Data = make(map[string]jinja.Value, n)
	return d
}

func listValue(items []jsonv.Value) jinja.Value {
	out := make([]jinja.Value, len(items))
	for i, it := range items {
		out[i] = toValue(it)
	}
	return jinja.NewList(out)
}

// truthy is Python's truth value of a decoded JSON value.
func truthy(v jsonv.Value) bool {
	switch v.Kind() {
	case jsonv.True:
		return true
	case jsonv.Number:
		f, ok := v.Float()
		return !ok || f != 0
	case jsonv.String:
		return v.Str() != ""
	case jsonv.Array, jsonv.Object:
		return v.Len() > 0
	}
	return false
}

// isPySpace is Python's str.isspace for one rune: Unicode white space plus the
// information separators U+001C–U+001F, which Go's unicode.IsSpace omits.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// pyStrip and pyLStrip are Python's str.strip() and str.lstrip().
func pyStrip(s string) string  { return strings.TrimFunc(s, isPySpace) }
func pyLStrip(s string) string { return strings.TrimLeftFunc(s, isPySpace) }
