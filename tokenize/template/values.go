package template

import (
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/tokenize"
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

// isPySpace is Python's str.isspace for one rune: Unicode white space plus the
// information separators U+001C–U+001F, which Go's unicode.IsSpace omits.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// pyStrip and pyLStrip are Python's str.strip() and str.lstrip().
func pyStrip(s string) string  { return strings.TrimFunc(s, isPySpace) }
func pyLStrip(s string) string { return strings.TrimLeftFunc(s, isPySpace) }

// What the Jinja library's values of a chat cost, measured (toValue of 100,000 of
// each): a dict 536 bytes (its own Go map), a list 56, a scalar 24–40. A request's
// values are 16 bytes each, so a chat of many small objects grew ~40× its body when
// converted (4 MiB of `{"abcd":"ef"}` tools: ~150 MiB during the render).
const (
	dictCost   = 536
	listCost   = 56
	scalarCost = 40
	// bigDictKeyCost is what each key of a dict of more than 8 costs on top: its map
	// then holds at least 8/7 slots a key, rounded up to a power of two (so up to 16/7),
	// each a 16-byte key, a 24-byte value and a control byte (94 bytes a key), where
	// the 536 of a small dict is one group of 8 slots.
	bigDictKeyCost = 96
	// smallDict is the most keys a dict holds in its first group of slots.
	smallDict = 8
	// partCost is a content part as the openai content format rebuilds it: a new dict
	// of two keys (type, and text or name), whatever the request's part was.
	partCost = dictCost + 4*scalarCost
	// maxConvertedBytes bounds the estimated template values of one render: ~60,000
	// objects, against a few thousand in a long agent conversation with tools.
	maxConvertedBytes = 32 << 20
)

// convertedCost estimates, from above, what the chat's values cost as template values
// rendered in the content format, stopping once past limit: every message, tool,
// document and kwarg whole (keys the conversion drops included), what conversation
// builds anew (an assistant's reasoning, converted twice; in the openai format, the
// list of a message's content parts, each a new dict, a string part or content
// included), and each tool call's arguments string as if every bracket opened an
// object, every comma began a scalar and every colon a member of a large dict.
func convertedCost(chat *tokenize.Chat, format ContentFormat, limit int) int {
	cost := 0
	add := func(v jsonv.Value) bool {
		cost = valueCost(v, cost, limit)
		return cost <= limit
	}
	for _, m := range chat.Messages {
		if !add(m) {
			return cost
		}
		if role, _ := m.Get("role"); role.Str() == "assistant" {
			if r, ok := reasoning(m); ok && !add(r) {
				return cost
			}
		}
		if format == ContentOpenAI {
			content, _ := m.Get("content")
			parts := content.Len()
			if content.Kind() == jsonv.String {
				parts = 1
			}
			if cost += listCost + parts*partCost; cost > limit {
				return cost
			}
		}
		calls, _ := m.Get("tool_calls")
		for _, call := range calls.Items() {
			fn, _ := call.Get("function")
			if args, _ := fn.Get("arguments"); args.Kind() == jsonv.String {
				if cost += argumentsCost(args.Str()); cost > limit {
					return cost
				}
			}
		}
	}
	for _, values := range [][]jsonv.Value{chat.Tools, chat.Documents} {
		for _, v := range values {
			if !add(v) {
				return cost
			}
		}
	}
	add(chat.TemplateKwargs)
	return cost
}

// valueCost adds v's estimated cost to cost, stopping once past limit.
func valueCost(v jsonv.Value, cost, limit int) int {
	switch v.Kind() {
	case jsonv.Object:
		cost += dictCost
		if v.Len() > smallDict {
			cost += v.Len() * bigDictKeyCost
		}
		for i := range v.Len() {
			if cost > limit {
				return cost
			}
			_, member := v.Member(i)
			cost = valueCost(member, cost+scalarCost, limit) // the key, and the value
		}
	case jsonv.Array:
		cost += listCost
		for _, item := range v.Items() {
			if cost > limit {
				return cost
			}
			cost = valueCost(item, cost, limit)
		}
	default:
		cost += scalarCost
	}
	return cost
}

// argumentsCost bounds what a tool call's arguments string costs once parsed.
func argumentsCost(s string) int {
	cost := scalarCost
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{', '[':
			cost += dictCost
		case ',':
			cost += scalarCost
		case ':':
			cost += scalarCost + bigDictKeyCost
		}
	}
	return cost
}
