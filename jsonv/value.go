package jsonv

import (
	"strconv"
	"unicode/utf8"
)

// Kind is the JSON type of a [Value].
type Kind uint8

// The kinds of JSON values. The zero Value is Null.
const (
	Null Kind = iota
	False
	True
	Number
	String
	Array
	Object
)

var kindNames = [...]string{"null", "false", "true", "number", "string", "array", "object"}

// String names the kind as JSON spells it ("object", "true", …).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is a parsed JSON value. Objects keep their members in document order (a
// template's tojson must reproduce the request's key order); a key that appears twice
// keeps its first position and its last value, as Python's json module does. A Value is
// immutable once parsed and safe to share between goroutines.
type Value struct {
	kind Kind
	// str is a String's decoded text or a Number's literal as written.
	str string
	// items holds an Array's elements, or an Object's members as key, value, key,
	// value… (keys are String values): one slice keeps a Value at 40 bytes.
	items []Value
}

// Kind returns the value's JSON type.
func (v Value) Kind() Kind { return v.kind }

// IsNull reports whether v is null (or the zero Value).
func (v Value) IsNull() bool { return v.kind == Null }

// Str returns a String's text or a Number's literal, and "" for other kinds.
func (v Value) Str() string { return v.str }

// Bool returns true for the JSON literal true, false otherwise.
func (v Value) Bool() bool { return v.kind == True }

// Len returns the number of an Array's elements or an Object's members, else 0.
func (v Value) Len() int {
	switch v.kind {
	case Array:
		return len(v.items)
	case Object:
		return len(v.items) / 2
	}
	return 0
}

// Items returns an Array's elements (nil for other kinds). The slice is shared: do not
// modify it.
func (v Value) Items() []Value {
	if v.kind != Array {
		return nil
	}
	return v.items
}

// Member returns an Object's i-th member in document order. It panics if i is out of
// range, like a slice index.
func (v Value) Member(i int) (key string, value Value) {
	if v.kind != Object {
		panic("jsonv: Member of a " + v.kind.String())
	}
	return v.items[2*i].str, v.items[2*i+1]
}

// Get returns the member of an Object named key, and whether there is one.
func (v Value) Get(key string) (Value, bool) {
	if v.kind != Object {
		return Value{}, false
	}
	for i := 0; i < len(v.items); i += 2 {
		if v.items[i].str == key {
			return v.items[i+1], true
		}
	}
	return Value{}, false
}

// Int returns a Number that is an integer in the int64 range (written without fraction
// or exponent, as Python's json reads an int), and whether it is one.
func (v Value) Int() (int64, bool) {
	if v.kind != Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.str, 10, 64)
	return n, err == nil
}

// Float returns a Number as a float64, and false for other kinds or a literal out of
// the float64 range.
func (v Value) Float() (float64, bool) {
	if v.kind != Number {
		return 0, false
	}
	f, err := strconv.ParseFloat(v.str, 64)
	return f, err == nil
}

// IsInteger reports whether a Number is written as an integer (no fraction or exponent),
// which Python's json decodes as int rather than float, whatever its size.
func (v Value) IsInteger() bool {
	if v.kind != Number {
		return false
	}
	for i := 0; i < len(v.str); i++ {
		if c := v.str[i]; c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// StringValue returns a String value, for building values in code and tests.
func StringValue(s string) Value { return Value{kind: String, str: s} }

// ObjectValue returns an object of the given members, in order (keys must be distinct),
// for building values in code and tests. It panics if the slices differ in length.
func ObjectValue(keys []string, values []Value) Value {
	if len(keys) != len(values) {
		panic("jsonv: ObjectValue needs as many values as keys")
	}
	items := make([]Value, 0, 2*len(keys))
	for i, k := range keys {
		items = append(items, StringValue(k), values[i])
	}
	return Value{kind: Object, items: items}
}

// ArrayValue returns an array of the given elements.
func ArrayValue(items ...Value) Value { return Value{kind: Array, items: items} }

// BoolValue returns the JSON literal true or false.
func BoolValue(b bool) Value {
	if b {
		return Value{kind: True}
	}
	return Value{kind: False}
}

// AppendCompact appends v as compact JSON (no spaces), keys in order, strings escaped
// as encoding/json does without HTML escaping.
func (v Value) AppendCompact(dst []byte) []byte {
	switch v.kind {
	case False:
		return append(dst, "false"...)
	case True:
		return append(dst, "true"...)
	case Number:
		return append(dst, v.str...)
	case String:
		return AppendQuoted(dst, v.str, false)
	case Array:
		dst = append(dst, '[')
		for i, it := range v.items {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = it.AppendCompact(dst)
		}
		return append(dst, ']')
	case Object:
		dst = append(dst, '{')
		for i := 0; i < len(v.items); i += 2 {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendQuoted(dst, v.items[i].str, false)
			dst = append(dst, ':')
			dst = v.items[i+1].AppendCompact(dst)
		}
		return append(dst, '}')
	}
	return append(dst, "null"...)
}

// AppendQuoted appends s as a JSON string. With asciiOnly, every rune above U+007F is
// written as \uXXXX (surrogate pairs above U+FFFF), as Python's json.dumps does by
// default; without it, only what JSON requires is escaped (Python's ensure_ascii=False).
func AppendQuoted(dst []byte, s string, asciiOnly bool) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c < 0x20 || c == 0x7f && asciiOnly:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !asciiOnly {
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		if r >= 0x10000 {
			r -= 0x10000
			hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
			dst = append(dst, '\\', 'u', hex[hi>>12], hex[hi>>8&0xf], hex[hi>>4&0xf], hex[hi&0xf])
			r = lo
		}
		dst = append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
		i += size
	}
	return append(dst, '"')
}
